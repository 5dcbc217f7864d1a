"""A drafter source whose drafters keep state across the requests of one server slot.

Upstream keeps the state of its n-gram drafters per sequence id, and a server slot is one sequence id
for the server's whole life, so what a slot's earlier requests taught a drafter (the n-gram cache's
counts, the map drafters' per-key acceptance) is there for its next request: that is what pays on
chat and agent traffic, where the same spans come back turn after turn. The server hands the slot id
to :meth:`SlotStateSource.new` (``server.runtime.speculation``); a sequence without a slot (``mlxcel
generate``, a test) gets a fresh state of its own.

The engine thread is the only caller, so the store needs no lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxcel.drafters.source import DrafterSource
from mlxcel.engine.speculative.drafter import Drafter


class SlotStateSource(DrafterSource):
    """Makes one drafter per sequence, handing it its slot's state (made by ``fresh`` on the slot's
    first request), or a fresh state when the sequence has no slot."""

    def __init__(self, make: Callable[[int, int | None, Any], Drafter], fresh: Callable[[], Any],
                 declared_block: int, description: str):
        super().__init__(lambda n_min, ngram_max: make(n_min, ngram_max, fresh()), declared_block, description)
        self._make_with_state = make
        self._fresh = fresh
        self._states: dict[int, Any] = {}

    def state(self, slot: int) -> Any:
        """Slot ``slot``'s state, made on first use and kept for the source's (the server's) life."""
        if slot not in self._states:
            self._states[slot] = self._fresh()
        return self._states[slot]

    def new(self, n_min: int = 0, ngram_max: int | None = None, slot: int | None = None) -> Drafter:
        state = self._fresh() if slot is None else self.state(slot)
        return self._make_with_state(n_min, ngram_max, state)
