"""What a drafter hands a verify round: the drafted tokens and, when known, the distribution
each was drawn from. Lives in the engine so verify rounds need no import from ``drafters``."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass
class Proposal:
    """A drafted block. ``q`` is ``[len(tokens), V]`` (row i: the distribution token i was drawn
    from) or None when the drafter does not know it (or it was not needed)."""

    tokens: list[int]
    q: mx.array | None = None
