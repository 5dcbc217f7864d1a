"""Drawing a proposal draft by draft, as every model drafter does (the draft model, DFlash, DSpark,
MTP): each draft is the argmax when the request is greedy, else a draw from the drafter's own
distribution ``q`` through the request's sampler chain, on the drafter's own random-key stream, so
the verify round can run any rule on the ``q`` rows it gets back.

A constrained request hands its drafter the sequence's grammar matcher (``Drafter.grammar``);
``DraftDraws`` then masks each draft's row with what the grammar allows after the drafts before it
(:meth:`DraftDraws.constrain`), so q is the drafter's own constrained distribution and no draft is
forbidden, and ends the proposal where the grammar ends. It walks the matcher over its drafts and
rolls it back when the proposal is taken, so the verify round finds it at the emitted sequence."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel.engine.sampling.chain import SamplerChain, sample
from mlxcel.engine.sampling.filters import NEG_INF
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, allowed_rows
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
    (what the next draw's sampler sees), ``position`` the next draft's absolute position;
    ``grammar`` the request's matcher, or None."""

    def __init__(self, sequence: Sequence[int], grammar: GrammarMatcher | None = None):
        self.history = [int(t) for t in sequence]
        self.tokens: list[int] = []
        self._rows: list[mx.array] = []
        self.grammar = grammar

    @property
    def position(self) -> int:
        return len(self.history)

    @property
    def done(self) -> bool:
        """The grammar has ended: nothing worth drafting can follow."""
        return self.grammar is not None and self.grammar.stopped

    def constrain(self, logits: mx.array) -> mx.array:
        """A ``[1, V]`` row of the next draft's logits with what the grammar forbids there at -inf
        (the row itself when unconstrained). Before the sampler chain's bias and penalties, which
        leave a -inf where it is, so the draw is from the drafter's constrained q."""
        if self.grammar is None:
            return logits
        return mx.where(allowed_rows(self.grammar.masks(), logits.shape[-1]), logits, NEG_INF)

    def add(self, token: int, q: mx.array | None) -> None:
        self.tokens.append(token)
        self.history.append(token)
        if q is not None:
            self._rows.append(q)
        if self.grammar is not None:
            self.grammar.advance([token])

    def proposal(self) -> Proposal:
        """The drafted block (the grammar matcher back where the proposal started)."""
        if self.grammar is not None:
            self.grammar.rollback(len(self.tokens))
            self.grammar = None
        return Proposal(self.tokens, mx.concatenate(self._rows, axis=0) if self._rows else None)
