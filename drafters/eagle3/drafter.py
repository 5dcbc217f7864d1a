"""The EAGLE-3 drafter: one decoder layer chained ``k`` steps, conditioned on three of the target's
hidden states (``network.py``), proposing over the target's vocabulary through the ``d2t`` map.

Entries, positions and the one invariant. The layer's KV cache holds one entry per target
position ``j``: the pair (fused target features ``g_j``, token ``x_{j+1}``), whose output predicts
``x_{j+2}``. Between rounds the sequence has ``L`` tokens, the target's cache holds ``L - 1`` of
them and the target has produced the features of positions ``0 .. L - 2``; the drafter has fed
entries ``0 .. e - 1`` and holds the fused rows of the rest as *owed*::

    entries + owed rows == L - 1 == the target cache length

A proposal feeds the owed entries in one forward (their tokens are ``sequence[e + 1 : L]``, the
last being the pending token; a long prompt in chunks), takes the last entry's output for ``d_0``,
then chains: the entry for ``d_i`` pairs the layer's own output state (before the final norm) with
``d_{i-1}``, as EAGLE-3 is trained to. Chained entries are provisional and dropped after the round;
the verify forward hands back the target's features of the pending token and every accepted draft
(``observe_target``, from the very forward that verified them: no second pass), which become the
owed entries of the next proposal. A proposal nobody verified (retracted) is harmless: the next
one drops its chained entries and runs the newest entry again.

Vocabulary: the head scores the *draft* vocabulary (often 32k of a 128k or 150k target); each row
is laid onto the target's vocabulary at the ``d2t`` ids, every other token at -inf. So a draft is
always a target token id, and ``q`` (the request's own sampler chain over that row, drawn on the
drafter's key stream) gives no mass to tokens outside the draft vocabulary, which is exactly the
distribution the draft was drawn from.

Rules: unlike the other model-based kinds, EAGLE-3 is verified with sampler-match above temperature
0 (``argmax_verify`` off): every emitted token is the target's own draw, so the stream is the
target's sample, token for token what plain decoding gives with the same seed. It reports ``q``,
so the stochastic opt-in runs modified rejection sampling (distribution-equal, acceptance
``sum min(p, q)`` instead of ``sum p q``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel.drafters.draws import DraftDraws, draw_draft
from mlxcel.drafters.eagle3.checkpoint import Eagle3Checkpoint, load_directory
from mlxcel.drafters.eagle3.gguf_checkpoint import load_gguf
from mlxcel.drafters.eagle3.target_binding import TargetBinding, bind_checkpoint
from mlxcel.drafters.trailing_cache import TrailingCacheDrafter
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures


class Eagle3Drafter(TrailingCacheDrafter):
    kind = "eagle3"
    label = "EAGLE-3"
    argmax_verify = False  # sampler-match by default; q reported, so the stochastic opt-in is rejection sampling

    def __init__(self, checkpoint: Eagle3Checkpoint, *, target_vocab_size: int | None = None, eos_token_ids=(),
                 tokenizer=None, prefill_step: int = 512):
        self.checkpoint = checkpoint
        self.network = checkpoint.network
        self.target_vocab_size = target_vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer = tokenizer
        self.prefill_step = max(1, int(prefill_step))
        self.binding: TargetBinding | None = None
        self.feature_layers: tuple[int, ...] = ()
        self._reset_cache([])  # owed rows: the fused rows of the target's three layers
        self.chain: SamplerChain | None = None
        self.seed = 0

    @classmethod
    def load(cls, path: str | Path, **kwargs) -> Eagle3Drafter:
        """A checkpoint directory, or a GGUF file as llama.cpp converts one."""
        if Path(path).expanduser().is_file():
            return cls(load_gguf(path), **kwargs)
        return cls(load_directory(path), **kwargs)

    @property
    def declared_block(self) -> int:
        return self.checkpoint.spec.block

    # -- binding and state ------------------------------------------------------------------

    def bind(self, target_model: Any) -> None:
        if self.binding is not None and self.binding.target is target_model:
            return
        self.binding = bind_checkpoint(self.checkpoint, target_model, self.target_vocab_size)
        self.feature_layers = self.binding.feature_layers

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        if self.binding is None:
            raise RuntimeError("bind the EAGLE-3 drafter to its target before starting it")
        self._reset_cache(self.network.make_cache())
        self.chain = SamplerChain(params, vocab_size=self.binding.vocab_size, eos_token_ids=self.eos_token_ids,
                                  tokenizer=self.tokenizer)
        self.seed = seed

    def observe_target(self, features: TargetFeatures) -> None:
        if features.length:
            self._owe(self.network.fuse(features.concat(self.feature_layers)))

    # -- drafting ---------------------------------------------------------------------------

    def _feed_owed(self, sequence: Sequence[int]) -> mx.array:
        """Feed every owed entry; the newest entry's output state ``[1, H]``."""
        tokens, rows = self._take_owed(sequence)
        step = self.prefill_step
        for i in range(0, len(tokens), step):
            out = self.network.step(self.binding.embed(tokens[i:i + step]), rows[i:i + step], self.cache)
            if i + step < len(tokens):
                mx.eval([c.state for c in self.cache])
        return out[-1:]

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        if k <= 0:
            return Proposal([])
        state = self._feed_owed(sequence)
        draws = DraftDraws(sequence, self.grammar)
        for i in range(k):
            if draws.done:
                break
            if i:
                state = self.network.step(self.binding.embed([draws.tokens[-1]]), state, self.cache)
                self.provisional += 1
            row = draws.constrain(self.binding.target_row(state))
            if self.grammar is not None and not bool(mx.any(row > -mx.inf).item()):
                break  # the grammar allows nothing the draft vocabulary holds here
            draws.add(*draw_draft(self.chain, row, draws.history, self.seed, draws.position))
        return draws.proposal()
