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

from typing import Any

from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.target_features import TargetFeatures

__all__ = ["Drafter", "ModelDrafter", "Proposal", "TargetFeatures"]


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


class ModelDrafter(Drafter):
    """A drafter network that conditions on the target's own hidden states (DFlash, DSpark, the
    Muse Glimmer assistant, MTP heads).

    Such a drafter has no embeddings or LM head of its own: ``bind(target_model)`` borrows the
    target's. The verify round runs the target through ``engine.speculative.target_features`` (the same
    logits, plus the outputs of the decoder layers named by ``feature_layers``) and, after the
    acceptance rule and the cache rewind, hands the drafter the features of exactly the tokens
    the target's cache gained (``observe_target``): the pending token and the accepted drafts.
    Before the first round the caller hands it the prompt's features the same way, so the rows
    the drafter has seen always equal the target cache's length (``context_length``).

    ``propose`` returns ``q`` (the distribution each drafted token was drawn from) whenever the
    request samples, so modified rejection sampling can run on these paths; by default they are
    verified against the target's argmax (``argmax_verify``), as the reference system does.
    ``probe_gated``: the verify round consults the block-versus-chain exactness probe
    (``engine.speculative.exactness_probe``) before it scores a block in one forward.
    """

    kind = "model"
    provides_distribution = True
    argmax_verify = True
    wants_features = True
    probe_gated = True
    greedy_only = False
    feature_layers: tuple[int, ...] = ()

    @abstractmethod
    def bind(self, target_model: Any) -> None:
        """Borrow what the drafter lacks from the target's mlx-lm module (embeddings, head)."""

    @abstractmethod
    def observe_target(self, features: TargetFeatures) -> None:
        """The target's cache gained ``features.length`` tokens; these are their features, in order."""

    def probe_widths(self, k: int) -> tuple[int, ...]:
        """Verify widths (rows) the exactness probe must clear, besides the block's own, before a
        block of up to ``k`` drafts is scored in one forward (a drafter whose width adapts names
        every width it may use)."""
        return ()
