"""Drawing a proposal draft by draft, as every model drafter does (the draft model, DFlash, DSpark,
MTP): each draft is the argmax when the request is greedy, else a draw from the drafter's own
distribution ``q`` through the request's sampler chain, on the drafter's own random-key stream, so
the verify round can run any rule on the ``q`` rows it gets back."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel.engine.sampling.chain import SamplerChain, sample
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.speculative.proposal import Proposal

# random_keys stream for the drafters' own draws (0-3 belong to the target's sampling).
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
