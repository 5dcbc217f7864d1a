"""Speculative decoding in the server: which drafter the command line asks for, loading it, and the
per-request state a speculating row carries through the scheduler.

Command line (upstream's flags, plus two mlxcel extensions):

* ``--spec-type ngram-simple`` or ``--draft-kind prompt-lookup``: prompt lookup, no second model.
  The other n-gram types (``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``) are
  served by the same prompt lookup: every rule here is lossless, so the choice of proposer can only
  change speed, never output, and refusing them would break working command lines for nothing.
  Block length: ``--spec-ngram-simple-size-m`` is the most a block may grow to (default
  :data:`LOOKUP_BLOCK`, not upstream's 48: a 48-token verify forward is expensive where the forward
  is compute-bound). Blocks start at 8 tokens and double after each fully accepted block, back to 8
  on any rejection (``drafters.governor.GovernedPromptLookupDrafter``); longest n-gram matched:
  ``--spec-ngram-simple-size-n`` (default 3; shorter suffixes are tried after it, down to 1).
* ``-md/--spec-draft-model FILE`` (``--spec-type draft-simple``): a classic draft model sharing the
  target's vocabulary, ``--spec-draft-n-max`` tokens per round (default 3, as upstream).
  ``-md`` *without* ``--spec-type`` drafts too. Upstream loads the draft model and silently never
  uses it; a user who passes a draft model wants drafting, so mlxcel does it and says so at startup.
* ``--spec-draft-n-min N``: a block shorter than N is not verified (the row decodes plainly).
* ``--spec-default``: prompt lookup (our default speculative setup; it needs no second model).
* model-based kinds (``draft-eagle3``, ``draft-mtp``, ``draft-dflash``, ``draft-dspark``, and a
  DFlash/DSpark/Muse drafter checkpoint given to ``-md``) are refused at startup: those round loops
  are not implemented in this server yet.
* ``--draft-kind`` (mlxcel): ``prompt-lookup`` or ``draft-model``; ``--draft-adaptive on|off``
  (mlxcel): whether the prompt-lookup governor may pause low-yield rows (default on).

Per request, ``speculative.n_max`` / ``speculative.n_min`` (upstream's fields) narrow the block;
``speculative.n_max: 0`` makes the request a plain one. Requests asking for token probabilities
(``n_probs`` / logprobs) decode plainly, since verify rounds do not produce per-token alternatives.

The acceptance rule is the engine's (``engine.acceptance.select_rule``) exactly as the CLI runs it:
greedy argmax at temperature 0, sampler-match above it, modified rejection sampling for a draft
model when ``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT=1``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..drafters.base import Drafter
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.governor import GovernedPromptLookupDrafter
from ..engine.acceptance import select_rule, stochastic_accept_enabled
from ..engine.drafter_checkpoints import drafter_structure
from ..engine.sampling_params import SamplerParams
from .timings import DraftStats

log = logging.getLogger(__name__)

PROMPT_LOOKUP = "prompt-lookup"
DRAFT_MODEL = "draft-model"
SERVER_KINDS = (PROMPT_LOOKUP, DRAFT_MODEL)
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
MODEL_BASED_TYPES = ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
MODEL_BASED_KINDS = ("dflash", "dspark", "muse-glimmer", "mtp", "internal-mtp")
SPEC_TYPES = ("none", "draft-simple", *MODEL_BASED_TYPES, *NGRAM_TYPES)

DRAFT_N_MAX = 3  # upstream's --spec-draft-n-max default
LOOKUP_BLOCK = 32  # the cap; blocks start at governor.BLOCK_START (8) and grow while fully accepted
LOOKUP_NGRAM_MAX = 3
LOOKUP_NGRAM_MIN = 1


class SpeculationError(ValueError):
    """A speculative command line that cannot be honoured (shown as one error line)."""


@dataclass(frozen=True)
class SpeculationSettings:
    kind: str  # PROMPT_LOOKUP | DRAFT_MODEL
    n_max: int
    n_min: int = 0
    ngram_min: int = LOOKUP_NGRAM_MIN
    ngram_max: int = LOOKUP_NGRAM_MAX
    adaptive: bool = True
    draft_model: str | None = None
    draft_hf: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def spec_type(self) -> str:
        """The upstream type name this setup answers to (``speculative.types``)."""
        return "draft-simple" if self.kind == DRAFT_MODEL else "ngram-simple"


def _switch(name: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "on", "true", "yes", "enabled"):
        return True
    if text in ("0", "off", "false", "no", "disabled"):
        return False
    raise SpeculationError(f"{name} {value!r}: expected on or off")


def resolve(config) -> SpeculationSettings | None:
    """The speculative setup a parsed ``ServerConfig`` asks for; None for a plain server."""
    notes: list[str] = []
    types = [t.strip() for t in (config.spec_type or "").split(",") if t.strip()]
    for t in types:
        if t not in SPEC_TYPES:
            raise SpeculationError(f"--spec-type {t!r}: unknown type (choose from {', '.join(SPEC_TYPES)})")
        if t in MODEL_BASED_TYPES:
            raise SpeculationError(f"--spec-type {t}: model-based drafters (EAGLE-3, MTP, DFlash, DSpark) are not "
                                   "implemented in mlxcel-server yet; use draft-simple with -md, or ngram-simple")
    types = [t for t in types if t != "none"]
    kinds = set()
    for t in types:
        kinds.add(DRAFT_MODEL if t == "draft-simple" else PROMPT_LOOKUP)
        if t in NGRAM_TYPES and t != "ngram-simple":
            notes.append(f"--spec-type {t} is served by prompt lookup (ngram-simple): same output, "
                         "possibly different speed")
    if config.draft_kind:
        kind = config.draft_kind.strip().lower()
        if kind in MODEL_BASED_KINDS:
            raise SpeculationError(f"--draft-kind {kind}: model-based drafters are not implemented in "
                                   "mlxcel-server yet (choose prompt-lookup or draft-model)")
        if kind not in SERVER_KINDS:
            raise SpeculationError(f"--draft-kind {kind!r}: unknown kind (choose prompt-lookup or draft-model)")
        kinds.add(kind)
    if config.spec_default and not kinds:
        kinds.add(PROMPT_LOOKUP)
    has_model = bool(config.draft_model or config.draft_hf)
    if has_model and not kinds:
        kinds.add(DRAFT_MODEL)
        notes.append("-md without --spec-type: drafting with the draft model (draft-simple); upstream would "
                     "load it and never draft")
    if len(kinds) > 1:
        raise SpeculationError(f"one drafter per server: the flags ask for {' and '.join(sorted(kinds))}")
    if not kinds:
        return None
    kind = kinds.pop()
    if kind == DRAFT_MODEL and not has_model:
        raise SpeculationError("--spec-type draft-simple needs a draft model: pass -md/--spec-draft-model FILE")
    if kind == PROMPT_LOOKUP and has_model:
        raise SpeculationError("prompt lookup needs no draft model; drop -md or use --spec-type draft-simple")
    if config.draft_model:
        refuse_drafter_checkpoint(config.draft_model)
    n_min = config.spec_draft_n_min if config.spec_draft_n_min is not None else 0
    if kind == DRAFT_MODEL:
        n_max = config.spec_draft_n_max if config.spec_draft_n_max is not None else DRAFT_N_MAX
    else:
        n_max = config.spec_ngram_simple_size_m if config.spec_ngram_simple_size_m is not None else LOOKUP_BLOCK
    if n_max < 1:
        raise SpeculationError(f"the draft block must be at least 1 token (got {n_max})")
    if n_min < 0 or n_min > n_max:
        raise SpeculationError(f"--spec-draft-n-min must be between 0 and the block length {n_max} (got {n_min})")
    ngram_max = config.spec_ngram_simple_size_n if config.spec_ngram_simple_size_n is not None else LOOKUP_NGRAM_MAX
    if ngram_max < 1:
        raise SpeculationError(f"--spec-ngram-simple-size-n must be >= 1 (got {ngram_max})")
    stochastic_accept_enabled()  # a bad switch value fails at startup, not on the first request
    return SpeculationSettings(kind=kind, n_max=n_max, n_min=n_min, ngram_min=LOOKUP_NGRAM_MIN, ngram_max=ngram_max,
                               adaptive=_switch("--draft-adaptive", config.draft_adaptive, True),
                               draft_model=config.draft_model, draft_hf=config.draft_hf, notes=tuple(notes))


def refuse_drafter_checkpoint(path: str) -> None:
    """A DFlash/DSpark/Muse drafter checkpoint is not a model by itself; refuse it clearly."""
    from ..drafters.kinds import read_drafter_config

    family = drafter_structure(read_drafter_config(path))
    if family is not None:
        raise SpeculationError(
            f"{path} is a {family} drafter checkpoint (no embeddings or LM head of its own); model-based drafters "
            "are not implemented in mlxcel-server yet. Pass an ordinary small model of the target's family to -md, "
            "or use --spec-type ngram-simple")


class Speculation:
    """A server's drafter setup, loaded: makes one drafter per speculating request."""

    def __init__(self, settings: SpeculationSettings, draft=None):
        self.settings = settings
        self.draft = draft  # the draft model's LoadedModel (DRAFT_MODEL only)

    @classmethod
    def load(cls, settings: SpeculationSettings, target) -> Speculation:
        """Load what the drafter needs (at startup, so no request ever pays the disk load)."""
        for note in settings.notes:
            log.warning("%s", note)
        if settings.kind != DRAFT_MODEL:
            log.info("Drafter ready: prompt-lookup (block 8 growing to %d, n-gram %d..%d, adaptive %s)", settings.n_max,
                     settings.ngram_min, settings.ngram_max, settings.adaptive)
            return cls(settings)
        from ..engine.loading import load_model
        from .speculative_options import check_same_vocabulary

        start = time.perf_counter()
        draft = load_model(settings.draft_model, hf_repo=settings.draft_hf)
        refuse_drafter_checkpoint(str(draft.path))
        check_same_vocabulary(target, draft)
        log.warning("Drafter loaded: draft-model %s in %.2f s (block %d); excluded from request timings",
                    draft.name, time.perf_counter() - start, settings.n_max)
        return cls(settings, draft)

    @property
    def kind(self) -> str:
        return self.settings.kind

    def eligible(self, opts) -> bool:
        """Whether a request speculates: not when it asks for token probabilities, nor when its own
        ``speculative.n_max`` is 0."""
        if opts.n_probs > 0:
            return False
        n_max = getattr(opts, "spec_n_max", None)
        return n_max is None or n_max > 0

    def start_row(self, opts, sequence: list[int], seed: int, target_vocab: int, prefill_step: int) -> SpecRow:
        s = self.settings
        n_max = min(s.n_max, opts.spec_n_max) if getattr(opts, "spec_n_max", None) else s.n_max
        req_min = getattr(opts, "spec_n_min", None)
        n_min = min(n_max, req_min if req_min is not None else s.n_min)
        drafter: Drafter
        if s.kind == DRAFT_MODEL:
            drafter = DraftModelDrafter(self.draft, target_vocab_size=target_vocab, prefill_step=prefill_step)
        else:
            drafter = GovernedPromptLookupDrafter(s.ngram_min, max(s.ngram_min, s.ngram_max), n_min=n_min,
                                                  adaptive=s.adaptive)
        params: SamplerParams = opts.sampler
        drafter.start(sequence, params, seed)
        rule = select_rule(params, has_proposal_distribution=drafter.provides_distribution,
                           deterministic_proposals=drafter.deterministic)
        return SpecRow(drafter=drafter, rule=rule, n_max=n_max, n_min=n_min, stats=DraftStats(kind=s.kind))


@dataclass
class SpecRow:
    """One speculating request's drafter and counters."""

    drafter: Drafter
    rule: str
    n_max: int
    n_min: int
    stats: DraftStats
    accepted_per_position: list[int] = field(default_factory=list)

    def block(self, remaining: int) -> int:
        """Drafts to ask for this round: at most ``n_max``, leaving room for the round's own token;
        0 (a plain step, no evidence) when fewer than ``n_min`` fit."""
        k = min(self.n_max, remaining - 1)
        return k if k >= max(1, self.n_min) else 0

    def record(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.stats.rounds += 1
        self.stats.drafted += proposed
        self.stats.accepted += accepted
        if len(self.accepted_per_position) < accepted:
            self.accepted_per_position.extend([0] * (accepted - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1
