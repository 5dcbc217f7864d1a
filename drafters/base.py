"""The one small interface every drafter implements.

A drafter proposes a block of tokens to follow the current sequence, optionally with the
distribution ``q`` each token was drawn from; after the target has verified the block it is
told what was emitted and brings its own state (a KV cache, an index) back in line with the
emitted sequence. ``sequence`` is always the whole token sequence so far (prompt + generated),
whose last token is the pending one the target has not forwarded yet.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from mlxcel.engine.draft_proposal import Proposal
from mlxcel.engine.sampling_params import SamplerParams

__all__ = ["Drafter", "Proposal"]


class Drafter(ABC):
    """Proposes blocks for a verify round.

    Class attributes describe what the acceptance-rule selector may rely on:
    ``provides_distribution`` (``propose`` fills ``q`` above temperature 0) and
    ``deterministic`` (the proposal is a point mass: ``q`` is one-hot on the drafted token).
    """

    kind: str = "drafter"
    provides_distribution: bool = False
    deterministic: bool = False

    @abstractmethod
    def start(self, prompt: Sequence[int], params: SamplerParams, seed: int) -> None:
        """Begin a new sequence whose first tokens are ``prompt``."""

    @abstractmethod
    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        """Up to ``k`` tokens to follow ``sequence`` (may be fewer, or none)."""

    @abstractmethod
    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        """The round ended: ``sequence`` now includes what was emitted, of which the first
        ``accepted`` tokens were ``proposal.tokens[:accepted]`` (an empty proposal: the round
        was a plain one-token step)."""

    def counters_line(self) -> str | None:
        """An extra report line of the drafter's own counters, or None."""
        return None
