"""The cache bookkeeping of a drafter whose layer trails the target by the rows it has not fed yet
(MTP heads, EAGLE-3): one cache entry per target position, the target's rows for the positions
not fed yet held as *owed*, and the entries a proposal chains on its own outputs held as
*provisional*::

    entries + owed rows == L - 1 == the target cache length   (L: the sequence's tokens)

A proposal feeds the owed rows in one forward (their tokens are ``sequence[e + 1 : L]``), then
chains provisional entries, which are dropped after the round: the verify forward hands back the
target's true rows (``_owe``), which become the next proposal's owed rows. A proposal that is
never verified (retracted) is harmless: the next :meth:`_take_owed` drops its chained entries and,
for the same sequence, runs the newest entry again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from mlxcel.engine.cache.kv_cache import rewind
from mlxcel.engine.speculative.drafter import ModelDrafter
from mlxcel.engine.speculative.proposal import Proposal


class TrailingCacheDrafter(ModelDrafter):
    """A model drafter with the trailing cache of the module docstring; a kind sets ``label`` (its
    name in messages), calls :meth:`_reset_cache` in ``start`` and :meth:`_owe` with the target's
    rows, and feeds what :meth:`_take_owed` returns before chaining."""

    label = "model"

    def _reset_cache(self, cache: list[Any]) -> None:
        self.cache = cache
        self.owed: list[mx.array] = []  # target rows [n, H] not yet fed, in position order
        self.provisional = 0  # chained entries of the last proposal, dropped in observe
        self.last_row: mx.array | None = None  # the row of the newest fed entry

    @property
    def entries(self) -> int:
        """Entries the cache holds (its provisional ones excluded)."""
        return (self.cache[0].offset if self.cache else 0) - self.provisional

    @property
    def context_length(self) -> int:
        """Target positions the drafter has the rows of (fed or owed)."""
        return self.entries + sum(int(r.shape[0]) for r in self.owed)

    def _owe(self, rows: mx.array) -> None:
        self.owed.append(rows)

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        # chained entries were conditioned on the drafter's own outputs, not the target's rows
        self._drop_provisional()

    def _drop_provisional(self) -> None:
        rewind(self.cache, self.provisional)
        self.provisional = 0

    def _take_owed(self, sequence: Sequence[int]) -> tuple[list[int], mx.array]:
        """The owed rows ``[n, H]`` and the tokens they pair with (``sequence[e + 1 :]``), taken:
        the caller feeds them, after which the cache holds every entry."""
        if self.provisional:  # a proposal nobody verified: drop its chained entries
            self._drop_provisional()
        if self.context_length != len(sequence) - 1:
            raise RuntimeError(f"{self.label} drafter out of step: it holds {self.context_length} target positions, "
                               f"the target cache holds {len(sequence) - 1}")
        if not self.owed:  # the same sequence proposed again: run its newest entry once more
            rewind(self.cache, 1)
            self.owed = [self.last_row]
        e = self.entries
        rows = mx.concatenate(self.owed, axis=0) if len(self.owed) > 1 else self.owed[0]
        self.owed, self.last_row = [], rows[-1:]
        return [int(t) for t in sequence[e + 1:]], rows
