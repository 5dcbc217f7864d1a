"""The interface every drafter implements, declared where its caller lives.

The verify round (``verify``) and the speculative session (``session``) call drafters through
these two classes only; ``mlxcel.drafters`` implements them. Every trait the engine relies on is
a declared class attribute with a default, so the engine reads attributes instead of probing for
them, and a drafter that conditions on the target's hidden states says so by being a
:class:`ModelDrafter`.

A drafter proposes a block of tokens to follow the current sequence, optionally with the
distribution ``q`` each token was drawn from; after the target has verified the block it is told
what was emitted and brings its own state (a KV cache, an index) back in line with the emitted
sequence. ``sequence`` is always the whole token sequence so far (prompt + generated), whose last
token is the pending one the target has not forwarded yet.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures

if TYPE_CHECKING:
    from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher

__all__ = ["Drafter", "ModelDrafter", "Proposal", "TargetFeatures"]


class Drafter(ABC):
    """Proposes blocks for a verify round.

    Traits the acceptance-rule selector and the session rely on (class attributes):

    * ``kind``: the drafter's name in logs;
    * ``provides_distribution``: ``propose`` fills ``q`` above temperature 0;
    * ``deterministic``: every proposal is a point mass (``q`` one-hot on the drafted token);
    * ``argmax_verify``: above temperature 0 the default rule is argmax-against-argmax rather than
      sampler-match (the model-based drafters, as the reference system verifies them);
    * ``greedy_only``: the drafter proposes greedy chains only, so a sampling request is declined
      and decoded plainly;
    * ``peeks``: :meth:`peek` says, at no cost, which token the drafter would draft first.

    ``grammar`` is the sequence's grammar matcher when the request is constrained (the session sets
    it before ``start``; None otherwise). A drafter may use it to propose only what the grammar
    allows (``drafters.draws.DraftDraws`` masks its q with it and leaves it as it found it); a
    drafter that ignores it is still correct, since the verify round cuts a proposal at its first
    forbidden draft.
    """

    kind: str = "drafter"
    provides_distribution: bool = False
    deterministic: bool = False
    argmax_verify: bool = False
    greedy_only: bool = False
    peeks: bool = False
    grammar: GrammarMatcher | None = None

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

    def peek(self, sequence: Sequence[int]) -> int | None:
        """The token :meth:`propose` would draft first after ``sequence``, or None when it would draft
        nothing, found without a forward and without changing what later calls return (``peeks``
        drafters only). A row that may not draft this step compares it with the token it emits
        instead: evidence of its acceptance that costs the shared forward nothing
        (``session.SpeculativeSession.evidence``)."""
        return None

    def counters_line(self) -> str | None:
        """An extra report line of the drafter's own counters, or None."""
        return None


class ModelDrafter(Drafter):
    """A drafter network that conditions on the target's own hidden states (DFlash, DSpark, the
    Muse Glimmer assistant, MTP heads).

    Such a drafter has no embeddings or LM head of its own: ``bind(target_model)`` borrows the
    target's. The verify round runs the target through ``target_features`` (the same logits, plus
    the outputs of the decoder layers named by ``feature_layers``) and, after the acceptance rule
    and the cache rewind, hands the drafter the features of exactly the tokens the target's cache
    gained (``observe_target``): the pending token and the accepted drafts. Before the first round
    the session hands it the prompt's features the same way, so the rows the drafter has seen
    always equal the target cache's length.

    ``propose`` returns ``q`` (the distribution each drafted token was drawn from) whenever the
    request samples, so modified rejection sampling can run on these paths; by default they are
    verified against the target's argmax (``argmax_verify``), as the reference system does.
    ``probe_gated``: the verify round consults the block-versus-chain exactness probe
    (``exactness_probe``) before it scores a block in one forward. ``declared_block`` is the most
    drafts the network proposes per round (its checkpoint's block), the default round size.
    ``reads_target_cache``: the drafter attends to the target's own KV cache (the Gemma 4 MTP
    assistant): right before every proposal the round hands it the cache (:meth:`read_target_cache`),
    which then holds exactly the committed tokens; the drafter only reads it
    (``cache.kv_cache.read_keys_values``).
    """

    kind = "model"
    provides_distribution = True
    argmax_verify = True
    probe_gated: bool = True
    feature_layers: tuple[int, ...] = ()
    reads_target_cache: bool = False

    @property
    @abstractmethod
    def declared_block(self) -> int:
        """The most drafts one proposal holds (what the checkpoint declares)."""

    @abstractmethod
    def bind(self, target_model: Any) -> None:
        """Borrow what the drafter lacks from the target's mlx-lm module (embeddings, head)."""

    @abstractmethod
    def observe_target(self, features: TargetFeatures) -> None:
        """The target's cache gained ``features.length`` tokens; these are their features, in order."""

    def read_target_cache(self, cache: list[Any]) -> None:
        """The target's cache, holding the committed tokens, for the proposal that follows (read only)."""

    def probe_widths(self, k: int) -> tuple[int, ...]:
        """Verify widths (rows) the exactness probe must clear, besides the block's own, before a
        block of up to ``k`` drafts is scored in one forward (a drafter whose width adapts names
        every width it may use)."""
        return ()
