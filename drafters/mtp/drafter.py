"""The MTP drafter: a multi-token-prediction head chained ``k`` steps on the target's hidden states.

Entries, positions and the one invariant. The head's KV cache holds one entry per target
position ``j``: the pair (target hidden ``h_j``, token ``x_{j+1}``), which predicts ``x_{j+2}``.
Between rounds the sequence has ``L`` tokens, the target's cache holds ``L - 1`` of them and the
target has produced ``h_0 .. h_{L-2}``; the drafter has fed entries ``0 .. e - 1`` to its cache
and holds the hidden rows of the rest as *owed*::

    entries + owed rows == L - 1 == the target cache length

A proposal feeds the owed entries in one forward (their tokens are ``sequence[e + 1 : L]``, the
last one being the pending token), takes the last entry's logits for ``d_0``, then chains: the
entry for ``d_i`` pairs the head's own output hidden with ``d_{i-1}`` (the target has not seen
the drafts yet). Those chained entries are provisional and always dropped after the round; the
verify forward hands back the target's true hidden rows for the pending token and every
accepted draft (``observe_target``), which become the owed entries of the next proposal. So the
head conditions on exactly the prefix the target does, and its cache never holds a guess. A
proposal that is never verified (retracted) is harmless: the next ``propose`` drops its chained
entries and, for the same sequence, runs the newest entry again.

``q``: at temperature > 0 each draft is drawn from the head's logits through the request's own
sampler chain (the distribution reported as ``q``, so the opt-in modified rejection sampling is
lossless here), with its own key stream; at temperature 0 the draft is the argmax and no ``q``
is built. The default verify rule for this kind is argmax-against-argmax (``argmax_verify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel.drafters.draws import DraftDraws, draw_draft
from mlxcel.drafters.mtp.checkpoint import MtpCheckpoint, load_mtp, reload_mtp
from mlxcel.drafters.mtp.head import MtpHead
from mlxcel.drafters.trailing_cache import TrailingCacheDrafter
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures

# Drafts per round by default: the head chains on its own output hidden states, whose agreement with
# the target's decays with depth; three is the reference system's MTP default.
MTP_BLOCK = 3


class MtpDrafter(TrailingCacheDrafter):
    kind = "mtp"
    label = "MTP"
    feature_layers: tuple[int, ...] = ()  # reads only the final normalised hidden state
    declared_block = MTP_BLOCK

    def __init__(self, checkpoint: MtpCheckpoint, *, prefill_step: int = 512):
        self.checkpoint = checkpoint
        self.prefill_step = max(1, int(prefill_step))
        self.head: MtpHead | None = None
        self._bound_to: Any = None
        self._reset_cache([])  # owed rows: the target's final normalised hidden rows
        self.params: SamplerParams | None = None
        self.chain: SamplerChain | None = None
        self.seed = 0

    @classmethod
    def load(cls, target_path: str | Path, assistant_path: str | Path | None = None, *,
             prefill_step: int = 512) -> MtpDrafter:
        """The target's own MTP layers, or those of a separate assistant checkpoint."""
        return cls(load_mtp(target_path, assistant_path), prefill_step=prefill_step)

    # -- binding and state -------------------------------------------------------------------

    def bind(self, target_model: Any) -> None:
        if self._bound_to is target_model:
            return
        if not self.checkpoint.modules:  # released by an earlier bind: read them again
            self.checkpoint = reload_mtp(self.checkpoint)
        self.head = MtpHead(self.checkpoint, target_model)
        self._bound_to = target_model
        # The head holds its own (cast) copies now; the file's tensors would only double the memory.
        self.checkpoint = replace(self.checkpoint, modules=[])

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        if self.head is None:
            raise RuntimeError("bind the MTP drafter to its target before starting it")
        self._reset_cache(self.head.make_cache())
        self.params = params
        self.chain = None
        self.seed = seed

    def observe_target(self, features: TargetFeatures) -> None:
        if features.length:
            self._owe(features.normed)

    # -- drafting ----------------------------------------------------------------------------

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        if k <= 0:
            return Proposal([])
        tokens, hidden = self._take_owed(sequence)
        for i in range(0, len(tokens), self.prefill_step):  # a long prompt is fed in chunks
            logits, chained = self.head.step(tokens[i:i + self.prefill_step], hidden[i:i + self.prefill_step],
                                             self.cache)
            if i + self.prefill_step < len(tokens):
                mx.eval([c.state for c in self.cache])
        draws = DraftDraws(sequence, self.grammar)
        for i in range(k):
            if draws.done:
                break
            if i:
                logits, chained = self.head.step([draws.tokens[-1]], chained[-1:], self.cache)
                self.provisional += 1
            draws.add(*self._draw(draws.constrain(logits[-1:]), draws.history, draws.position))
        return draws.proposal()

    def _draw(self, logits: mx.array, history: list[int], position: int) -> tuple[int, mx.array | None]:
        """argmax when the request is greedy, else a draw from q = the request's sampler over the
        head's logits (returned)."""
        if self.chain is None:
            self.chain = SamplerChain(self.params, vocab_size=int(logits.shape[-1]))
        if self.chain.greedy:
            return int(logits.argmax(axis=-1).item()), None
        return draw_draft(self.chain, logits, history, self.seed, position)
