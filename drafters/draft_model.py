"""The classic drafter: a small model sharing the target's vocabulary.

It keeps its own KV cache over the same token sequence as the target and drafts ``k`` tokens
one forward at a time, each drawn from ``q``: the drafter's logits through the request's own
sampler chain (same temperature, filters and penalties as the target), or the argmax when the
sampler is greedy. Its draws use their own key stream, independent of the target's, so the
acceptance rates match the closed forms of the report's diagnostic line.

Cache bookkeeping, the part that must be exact: after proposing ``k`` drafts for a sequence of
length ``L`` the cache holds ``L + k - 1`` tokens (the last draft was never fed back). After the
round the cache is trimmed to the longest prefix it shares with the emitted sequence, and the
tokens of the sequence it still lacks, apart from the pending last one, are *owed*: they are
fed at the head of the next proposal. Invariant between rounds:
``offset + len(owed) == len(sequence) - 1 == the target cache length``. A fully accepted block
is the case that leaves something owed: its last proposal.

A draft model with recurrent layers (a small Qwen3.5 or LFM2 drafting for a larger one) cannot
drop tokens from those layers, so the drafter marks their states after every forward
(``cache.recurrent.StateMarks``; the states are held by reference, so this is free) and the
trim restores the mark at the kept length. Every length a trim can go back to was marked: the
first forward of a proposal feeds the whole committed sequence, and each later forward is one
draft.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel.drafters.draws import DraftDraws, draw_draft
from mlxcel.engine.cache.kv_cache import rewind
from mlxcel.engine.cache.recurrent import StateMarks, has_recurrent_state
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

# Encoded by target and drafter alike when both come from one tokenizer family.
VOCAB_PROBE = "Speculative decoding: x = f(y) + 42; naïve café, 東京, emoji \U0001f600.\n\tdef g(): return None"


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft model must tokenize like the target (its ids are verified as the target's ids)."""
    t_ids = list(target.tokenizer.encode(VOCAB_PROBE, add_special_tokens=False))
    d_ids = list(draft.tokenizer.encode(VOCAB_PROBE, add_special_tokens=False))
    if t_ids != d_ids:
        raise ModelLoadError(
            f"the draft model {draft.name} does not share the target's vocabulary (the same text encodes to "
            "different token ids); pick a drafter from the target's model family"
        )


class DraftModelDrafter(Drafter):
    kind = "draft-model"
    provides_distribution = True

    def __init__(self, draft: LoadedModel, *, target_vocab_size: int | None = None, prefill_step: int = 512):
        self.draft = draft
        self.target_vocab_size = target_vocab_size or draft.vocab_size
        self.prefill_step = prefill_step
        self.cache: list | None = None
        self.tokens: list[int] = []  # exactly what the cache holds, token for token
        self.owed: list[int] = []
        self.chain: SamplerChain | None = None
        self.seed = 0
        self.marks: StateMarks | None = None  # the recurrent layers' states per length (a hybrid draft model)

    @property
    def offset(self) -> int:
        return len(self.tokens)

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        """Begin drafting for ``sequence`` (its last token pending): nothing is cached yet, so
        everything before the pending token is owed and is prefilled by the first proposal."""
        self.cache = self.draft.make_cache()
        self.marks = StateMarks(self.cache) if has_recurrent_state(self.cache) else None
        self.tokens = []
        self.owed = [int(t) for t in sequence[:-1]]
        self.chain = SamplerChain(params, vocab_size=self.draft.vocab_size,
                                  eos_token_ids=self.draft.eos_token_ids, tokenizer=self.draft.tokenizer)
        self.seed = seed

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        feed = [*self.owed, int(sequence[-1])]
        if len(self.tokens) + len(feed) != len(sequence):
            raise RuntimeError(f"draft cache out of step: {len(self.tokens)} cached + {len(feed)} to feed "
                               f"!= {len(sequence)} tokens in the sequence")
        logits = self._forward(feed)
        self.owed = []
        draws = DraftDraws(sequence, self.grammar)
        for i in range(k):
            if draws.done:
                break
            if i:
                logits = self._forward([draws.tokens[-1]])
            draws.add(*self._draw(draws.constrain(logits), draws.history, draws.position))
        return draws.proposal()

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        # Keep the longest prefix the cache shares with the emitted sequence. A round emits its
        # accepted drafts plus one token, so the sequence the round started from (all of it
        # already matched by the cache) is the first len(sequence) - accepted - 1 tokens.
        target_len = len(sequence) - 1
        limit = min(len(self.tokens), target_len)
        keep = min(limit, len(sequence) - accepted - 1)
        while keep < limit and self.tokens[keep] == int(sequence[keep]):
            keep += 1
        rewind(self.cache, len(self.tokens) - keep, self.marks)
        if self.marks is not None:
            self.marks.rewound(len(self.tokens) - keep)
        del self.tokens[keep:]
        self.owed = [int(t) for t in sequence[keep:target_len]]

    def _forward(self, tokens: list[int]) -> mx.array:
        """Feed ``tokens`` (in prefill chunks), return the last position's logits ``[1, V]``."""
        logits = None
        for i in range(0, len(tokens), self.prefill_step):
            chunk = tokens[i : i + self.prefill_step]
            logits = self.draft.model(mx.array([chunk]), cache=self.cache)[0, -1:]
            if i + self.prefill_step < len(tokens):
                mx.eval([c.state for c in self.cache])
        self.tokens.extend(tokens)
        if self.marks is not None:
            self.marks.mark(len(self.tokens))
        return logits

    def _draw(self, logits: mx.array, history: list[int], position: int) -> tuple[int, mx.array | None]:
        """One draft for ``position``: argmax when greedy, else a draw from q (returned)."""
        if logits.shape[-1] > self.target_vocab_size:  # never propose ids the target lacks
            logits = logits[:, : self.target_vocab_size]
        return draw_draft(self.chain, logits, history, self.seed, position)
