"""Upstream's unified KV pool (``-kvu``, the default when ``-np`` is auto), as a token budget.

Upstream keeps every slot's tokens in one KV buffer of ``-c`` cells: a slot may grow to the whole
context, but all slots together cannot pass it. When a step finds no room, upstream first drops the
cached prompts of idle slots, and when that is not enough it ends every running request with 500
``Context size has been exceeded.`` and clears their caches. mlxcel's slots keep caches of their
own, so the pool is a count: the tokens each slot's cache holds, against ``-c``. The scheduler asks
for room before each prefill chunk and each decode step; memory then stays bounded by ``-c`` as a
llama-server user sized it, and the outcome when requests overflow together is upstream's.
"""

from __future__ import annotations

from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.runtime.slots import Slot

EXCEEDED = "Context size has been exceeded."


def exceeded() -> ApiError:
    return ApiError(EXCEEDED, "server_error")


def held(slot: Slot) -> int:
    """Tokens the slot's cache holds: its prompt so far and, while a request runs, what it generated
    (after a context shift: the shifted context)."""
    run = slot.run
    if run is not None and run.head is not None:
        return len(run.context_tokens())
    return len(slot.tokens) + (len(run.generated) if run is not None else 0)


class KvPool:
    def __init__(self, total: int):
        self.total = total

    def used(self, slots: list[Slot]) -> int:
        return sum(held(s) for s in slots)

    def make_room(self, slots: list[Slot], need: int) -> bool:
        """Whether ``need`` more tokens fit, after dropping idle slots' cached prompts (least
        recently used first) if they must go."""
        used = self.used(slots)
        if used + need <= self.total:
            return True
        for slot in sorted((s for s in slots if not s.busy and s.tokens), key=lambda s: s.last_used):
            used -= len(slot.tokens)
            slot.cache, slot.tokens = None, []
            if used + need <= self.total:
                return True
        return False
