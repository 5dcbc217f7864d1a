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
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.decode.kv_cache import rewind
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.sampling.chain import SamplerChain, sample
from mlxcel.engine.sampling.params import SamplerParams

from mlxcel.engine.speculative.drafter import Drafter

# random_keys stream for the drafter's own draws (0-3 belong to the target's sampling).
DRAFT_STREAM = 4


def draw_draft(chain: SamplerChain, logits: mx.array, history: list[int], seed: int,
               position: int) -> tuple[int, mx.array | None]:
    """One draft for ``position`` from a ``[1, V]`` row (``history`` already includes the drafts
    before it) through the request's sampler chain: the argmax when greedy, else a draw from q on
    the drafter's own key stream, returned with q."""
    if chain.greedy:
        return int(chain.select(logits, history)[0]), None
    q = chain.distribution(logits, history, (), seed, position)
    return sample(q[0], position_key(seed, position, DRAFT_STREAM)), q


class DraftDraws:
    """A proposal being drawn, draft by draft: ``history`` is the sequence plus the drafts so far
    (what the next draw's sampler sees), ``position`` the next draft's absolute position."""

    def __init__(self, sequence: Sequence[int]):
        self.history = [int(t) for t in sequence]
        self.tokens: list[int] = []
        self._rows: list[mx.array] = []

    @property
    def position(self) -> int:
        return len(self.history)

    def add(self, token: int, q: mx.array | None) -> None:
        self.tokens.append(token)
        self.history.append(token)
        if q is not None:
            self._rows.append(q)

    def proposal(self) -> Proposal:
        return Proposal(self.tokens, mx.concatenate(self._rows, axis=0) if self._rows else None)


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

    @property
    def offset(self) -> int:
        return len(self.tokens)

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        """Begin drafting for ``sequence`` (its last token pending): nothing is cached yet, so
        everything before the pending token is owed and is prefilled by the first proposal."""
        self.cache = self.draft.make_cache()
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
        draws = DraftDraws(sequence)
        for i in range(k):
            if i:
                logits = self._forward([draws.tokens[-1]])
            draws.add(*self._draw(logits, draws.history, draws.position))
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
        rewind(self.cache, len(self.tokens) - keep)
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
        return logits

    def _draw(self, logits: mx.array, history: list[int], position: int) -> tuple[int, mx.array | None]:
        """One draft for ``position``: argmax when greedy, else a draw from q (returned)."""
        if logits.shape[-1] > self.target_vocab_size:  # never propose ids the target lacks
            logits = logits[:, : self.target_vocab_size]
        return draw_draft(self.chain, logits, history, self.seed, position)
