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
  on any rejection (``drafters.lookup.governor.GovernedPromptLookupDrafter``); longest n-gram matched:
  ``--spec-ngram-simple-size-n`` (default 3; shorter suffixes are tried after it, down to 1).
* ``-md/--spec-draft-model FILE`` (``--spec-type draft-simple``): a classic draft model sharing the
  target's vocabulary, ``--spec-draft-n-max`` tokens per round (default 3, as upstream).
  ``-md`` *without* ``--spec-type`` drafts too. Upstream loads the draft model and silently never
  uses it; a user who passes a draft model wants drafting, so mlxcel does it and says so at startup.
* ``--spec-draft-n-min N``: a block shorter than N is not verified (the row decodes plainly).
* ``--spec-default``: prompt lookup (our default speculative setup; it needs no second model).
* model-based drafters, which read the target's hidden states and borrow its embeddings and head:
  ``--spec-type draft-dflash`` / ``--draft-kind dflash`` with ``-md DIR`` a DFlash, DSpark or Muse
  Glimmer assistant checkpoint (recognised by structure; ``-md`` such a directory alone selects it
  too), ``--spec-type draft-dspark`` / ``--draft-kind dspark`` and ``--draft-kind muse-glimmer``
  (which insist on that family), ``--spec-type draft-mtp`` / ``--draft-kind mtp`` (the target's own
  MTP layers, or a NextN assistant given with ``-md``; ``internal-mtp`` is the former). Block:
  ``--spec-draft-n-max`` or, by default, what the drafter declares (DFlash/Muse ``block_size - 1``,
  DSpark ``block_size``; MTP 3). ``draft-eagle3`` is refused (not implemented). The counters report
  ``draft_kind`` ``dflash`` for the three DFlash-family drafters (one round loop) and ``mtp``.
  These drafters need the prompt's hidden states before their first round: a speculating row
  computes them with one extra target pass over its prompt (the slot's own prefill does not keep
  them); it runs after the first token is sampled, so its time is in the request's predicted_ms.
* DSpark proposes greedy chains only: a request that samples (temperature > 0 and top_k != 1) is
  decoded plainly, with one warning in the log per request.
* ``--draft-kind`` (mlxcel): ``prompt-lookup``, ``draft-model``, or a model-based kind above;
  ``--draft-adaptive on|off`` (mlxcel): whether the prompt-lookup governor may pause low-yield rows
  (default on).

Per request, ``speculative.n_max`` / ``speculative.n_min`` (upstream's fields) narrow the block;
``speculative.n_max: 0`` makes the request a plain one. Requests asking for token probabilities
(``n_probs`` / logprobs) decode plainly, since verify rounds do not produce per-token alternatives.

The acceptance rule is the engine's (``engine.speculative.acceptance.select_rule``) exactly as the CLI runs it:
greedy argmax at temperature 0; above it sampler-match for the draft model and prompt lookup, and
argmax-against-argmax for the model-based drafters (the greedy stream, as the reference system
serves it); modified rejection sampling (lossless) for a draft model or a model-based drafter when
``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT=1`` or the request's ``speculative.stochastic_accept: true``
(``false`` turns it off for that request).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.drafters.lookup.governor import GovernedPromptLookupDrafter
from mlxcel.engine.speculative.acceptance import select_rule, stochastic_accept_enabled
from mlxcel.drafters.checkpoints import drafter_structure
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.runtime.timings import DraftStats

log = logging.getLogger(__name__)

PROMPT_LOOKUP = "prompt-lookup"
DRAFT_MODEL = "draft-model"
DFLASH = "dflash"  # the DFlash round loop: DFlash, DSpark and Muse Glimmer assistant drafters
MTP = "mtp"
DFLASH_FAMILIES = ("dflash", "dspark", "muse-glimmer")
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
MODEL_BASED_TYPES = ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
SPEC_TYPES = ("none", "draft-simple", *MODEL_BASED_TYPES, *NGRAM_TYPES)
# --draft-kind / --spec-type -> (round loop, the drafter family it insists on, or None: any DFlash family)
KINDS = {PROMPT_LOOKUP: (PROMPT_LOOKUP, None), DRAFT_MODEL: (DRAFT_MODEL, None), "dflash": (DFLASH, None),
         "dspark": (DFLASH, "dspark"), "muse-glimmer": (DFLASH, "muse-glimmer"), "mtp": (MTP, "mtp"),
         "internal-mtp": (MTP, "internal-mtp")}
TYPES = {"draft-simple": DRAFT_MODEL, "draft-dflash": "dflash", "draft-dspark": "dspark", "draft-mtp": "mtp",
         **{t: PROMPT_LOOKUP for t in NGRAM_TYPES}}
SERVER_KINDS = tuple(KINDS)
MTP_N_MAX = 3

DRAFT_N_MAX = 3  # upstream's --spec-draft-n-max default
LOOKUP_BLOCK = 32  # the cap; blocks start at governor.BLOCK_START (8) and grow while fully accepted
LOOKUP_NGRAM_MAX = 3
LOOKUP_NGRAM_MIN = 1


class SpeculationError(ValueError):
    """A speculative command line that cannot be honoured (shown as one error line)."""


@dataclass(frozen=True)
class SpeculationSettings:
    kind: str  # PROMPT_LOOKUP | DRAFT_MODEL | DFLASH | MTP
    n_max: int | None  # None: the model-based drafter's own block (resolved when it loads)
    n_min: int = 0
    ngram_min: int = LOOKUP_NGRAM_MIN
    ngram_max: int = LOOKUP_NGRAM_MAX
    adaptive: bool = True
    draft_model: str | None = None
    draft_hf: str | None = None
    notes: tuple[str, ...] = ()
    family: str | None = None  # DFLASH: dflash | dspark | muse-glimmer; MTP: mtp | internal-mtp

    @property
    def spec_type(self) -> str:
        """The upstream type name this setup answers to (``speculative.types``)."""
        if self.kind == DFLASH:
            return "draft-dspark" if self.family == "dspark" else "draft-dflash"
        if self.kind == MTP:
            return "draft-mtp"
        return "draft-simple" if self.kind == DRAFT_MODEL else "ngram-simple"

    @property
    def model_based(self) -> bool:
        return self.kind in (DFLASH, MTP)


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
    requested: dict[str, str | None] = {}  # round loop -> family insisted on
    for t in types:
        if t not in SPEC_TYPES:
            raise SpeculationError(f"--spec-type {t!r}: unknown type (choose from {', '.join(SPEC_TYPES)})")
        if t == "draft-eagle3":
            raise SpeculationError("--spec-type draft-eagle3: EAGLE-3 drafters are not implemented in mlxcel-server; "
                                   "use draft-dflash, draft-mtp, draft-simple with -md, or ngram-simple")
        if t == "none":
            continue
        loop, family = KINDS[TYPES[t]]
        requested[loop] = family or requested.get(loop)
        if t in NGRAM_TYPES and t != "ngram-simple":
            notes.append(f"--spec-type {t} is served by prompt lookup (ngram-simple): same output, "
                         "possibly different speed")
    if config.draft_kind:
        kind = config.draft_kind.strip().lower()
        if kind not in KINDS:
            raise SpeculationError(f"--draft-kind {kind!r}: unknown kind (choose from {', '.join(KINDS)})")
        loop, family = KINDS[kind]
        if requested.get(loop) and family and requested[loop] != family:
            raise SpeculationError(f"--draft-kind {kind} contradicts --spec-type {config.spec_type}")
        requested[loop] = family or requested.get(loop)
    if config.spec_default and not requested:
        requested[PROMPT_LOOKUP] = None
    has_model = bool(config.draft_model or config.draft_hf)
    structure = _structure(config.draft_model) if config.draft_model else None
    if has_model and not requested:
        if structure in DFLASH_FAMILIES:
            requested[DFLASH] = structure
            notes.append(f"-md is a {structure} drafter checkpoint: serving it on the DFlash round loop")
        elif structure == MTP:
            requested[MTP] = MTP
            notes.append("-md is an MTP assistant checkpoint: serving it on the MTP round loop")
        else:
            requested[DRAFT_MODEL] = None
            notes.append("-md without --spec-type: drafting with the draft model (draft-simple); upstream would "
                         "load it and never draft")
    if len(requested) > 1:
        raise SpeculationError(f"one drafter per server: the flags ask for {' and '.join(sorted(requested))}")
    if not requested:
        return None
    kind, family = requested.popitem()
    if kind == DRAFT_MODEL and not has_model:
        raise SpeculationError("--spec-type draft-simple needs a draft model: pass -md/--spec-draft-model FILE")
    if kind == PROMPT_LOOKUP and has_model:
        raise SpeculationError("prompt lookup needs no draft model; drop -md or use --spec-type draft-simple")
    if kind == DRAFT_MODEL and structure in DFLASH_FAMILIES:
        raise SpeculationError(f"{config.draft_model} is a {structure} drafter checkpoint (no embeddings or LM head "
                               "of its own), not a draft model; serve it with --spec-type draft-dflash (or -md alone)")
    if kind == DFLASH:
        family = _dflash_family(config, structure, family)
    if kind == MTP:
        family = _mtp_family(config, structure, family)
    n_min = config.spec_draft_n_min if config.spec_draft_n_min is not None else 0
    if kind == DRAFT_MODEL:
        n_max = config.spec_draft_n_max if config.spec_draft_n_max is not None else DRAFT_N_MAX
    elif kind == PROMPT_LOOKUP:
        n_max = config.spec_ngram_simple_size_m if config.spec_ngram_simple_size_m is not None else LOOKUP_BLOCK
    else:
        n_max = config.spec_draft_n_max  # None: the drafter's own block
    if n_max is not None and n_max < 1:
        raise SpeculationError(f"the draft block must be at least 1 token (got {n_max})")
    if n_min < 0 or (n_max is not None and n_min > n_max):
        raise SpeculationError(f"--spec-draft-n-min must be between 0 and the block length {n_max} (got {n_min})")
    ngram_max = config.spec_ngram_simple_size_n if config.spec_ngram_simple_size_n is not None else LOOKUP_NGRAM_MAX
    if ngram_max < 1:
        raise SpeculationError(f"--spec-ngram-simple-size-n must be >= 1 (got {ngram_max})")
    stochastic_accept_enabled()  # a bad switch value fails at startup, not on the first request
    if kind in (DFLASH, MTP):
        from mlxcel.engine.speculative.exactness_probe import probe_mode

        probe_mode()
    return SpeculationSettings(kind=kind, n_max=n_max, n_min=n_min, ngram_min=LOOKUP_NGRAM_MIN, ngram_max=ngram_max,
                               adaptive=_switch("--draft-adaptive", config.draft_adaptive, True),
                               draft_model=config.draft_model, draft_hf=config.draft_hf, notes=tuple(notes),
                               family=family)


def _structure(path: str) -> str | None:
    """What a -md path is by structure: a DFlash family, "mtp" (a NextN assistant), or None."""
    from mlxcel.drafters.registry import read_drafter_config
    from mlxcel.drafters.mtp.checkpoint import is_assistant_checkpoint

    config = read_drafter_config(path)
    family = drafter_structure(config)
    if family is not None:
        return family
    return MTP if config and is_assistant_checkpoint(config) else None


def _dflash_family(config, structure: str | None, family: str | None) -> str:
    if not config.draft_model:
        raise SpeculationError("the DFlash round loop needs its drafter: pass -md DIR (a DFlash, DSpark or Muse "
                               "Glimmer assistant checkpoint directory)")
    if structure not in DFLASH_FAMILIES:
        raise SpeculationError(f"{config.draft_model} is not a DFlash, DSpark or Muse Glimmer assistant checkpoint "
                               "(its config.json has no dflash_config, DFlashDraftModel, Lfm2DSparkDraftModel or "
                               "muse_glimmer_assistant); an ordinary small model drafts with --spec-type draft-simple")
    if family is not None and family != structure:
        raise SpeculationError(f"{family} was asked for, but {config.draft_model} is a {structure} drafter checkpoint")
    return structure


def _mtp_family(config, structure: str | None, family: str | None) -> str:
    if family == "internal-mtp" and config.draft_model:
        raise SpeculationError("--draft-kind internal-mtp uses the target's own MTP layers; drop -md")
    if config.draft_hf and not config.draft_model:
        raise SpeculationError("an MTP assistant is read from a local directory: pass -md DIR")
    if config.draft_model and structure != MTP:
        what = f"a {structure} drafter checkpoint" if structure else "not a NextN MTP assistant checkpoint"
        raise SpeculationError(f"--spec-type draft-mtp: {config.draft_model} is {what}; pass an MTP assistant to -md, "
                               "or no -md to use the target's own MTP layers")
    return MTP if config.draft_model else "internal-mtp"


def refuse_drafter_checkpoint(path: str) -> None:
    """A DFlash/DSpark/Muse drafter checkpoint is not a draft *model*; refuse it clearly there."""
    from mlxcel.drafters.registry import read_drafter_config

    family = drafter_structure(read_drafter_config(path))
    if family is not None:
        raise SpeculationError(
            f"{path} is a {family} drafter checkpoint (no embeddings or LM head of its own), not a draft model; "
            "serve it with --spec-type draft-dflash (or -md alone)")


class Speculation:
    """A server's drafter setup, loaded: makes one drafter per speculating request."""

    def __init__(self, settings: SpeculationSettings, draft=None, *, model_drafter=None, target=None):
        self.settings = settings
        self.draft = draft  # the draft model's LoadedModel (DRAFT_MODEL only)
        self.model_drafter = model_drafter  # DFLASH / MTP: a bound drafter, copied per request
        self.target = target

    @classmethod
    def load(cls, settings: SpeculationSettings, target) -> Speculation:
        """Load what the drafter needs (at startup, so no request ever pays the disk load)."""
        for note in settings.notes:
            log.warning("%s", note)
        if settings.model_based:
            return cls._load_model_drafter(settings, target)
        if settings.kind != DRAFT_MODEL:
            log.info("Drafter ready: prompt-lookup (block 8 growing to %d, n-gram %d..%d, adaptive %s)", settings.n_max,
                     settings.ngram_min, settings.ngram_max, settings.adaptive)
            return cls(settings)
        from mlxcel.engine.model.loading import load_model
        from mlxcel.server.cli.generate_speculative import check_same_vocabulary

        start = time.perf_counter()
        draft = load_model(settings.draft_model, hf_repo=settings.draft_hf)
        refuse_drafter_checkpoint(str(draft.path))
        check_same_vocabulary(target, draft)
        log.warning("Drafter loaded: draft-model %s in %.2f s (block %d); excluded from request timings",
                    draft.name, time.perf_counter() - start, settings.n_max)
        return cls(settings, draft)

    @classmethod
    def _load_model_drafter(cls, settings: SpeculationSettings, target) -> Speculation:
        start = time.perf_counter()
        if settings.kind == DFLASH:
            from mlxcel.drafters.registry import load_model_drafter

            drafter = load_model_drafter(settings.draft_model, target_vocab_size=target.vocab_size,
                                         eos_token_ids=target.eos_token_ids, tokenizer=target.tokenizer)
            declared = drafter.spec.max_proposals
            where = f"{settings.draft_model}, reads target layers {list(drafter.feature_layers)}"
        else:
            from mlxcel.drafters.mtp.drafter import MtpDrafter

            drafter = MtpDrafter.load(target.path, settings.draft_model)
            declared = MTP_N_MAX
            where = settings.draft_model or "the target's own MTP layers"
        drafter.bind(target.model)
        _materialize(drafter)
        n_max = min(settings.n_max, declared) if settings.n_max is not None else declared
        if settings.n_max is not None and settings.n_max > declared:
            log.warning("--spec-draft-n-max %d exceeds what the %s drafter proposes per block; using %d",
                        settings.n_max, drafter.kind, declared)
        settings = replace(settings, n_max=n_max, n_min=min(settings.n_min, n_max))
        log.warning("Drafter loaded: %s (%s) in %.2f s (block %d, %s); excluded from request timings",
                    drafter.kind, where, time.perf_counter() - start, n_max, _rule_note(drafter))
        return cls(settings, model_drafter=drafter, target=target)

    @property
    def kind(self) -> str:
        return self.settings.kind

    @property
    def draft_kind(self) -> str:
        """What the timings report: ``dflash`` for the whole DFlash family, ``mtp``, or the kind."""
        return self.settings.kind

    def eligible(self, opts) -> bool:
        """Whether a request speculates: not when it asks for token probabilities, nor when its own
        ``speculative.n_max`` is 0, nor a sampling request on a greedy-only drafter (DSpark: one
        warning, then plain decoding)."""
        if opts.n_probs > 0:
            return False
        n_max = getattr(opts, "spec_n_max", None)
        if n_max is not None and n_max <= 0:
            return False
        drafter = self.model_drafter
        if drafter is not None and getattr(drafter, "greedy_only", False) and not opts.sampler.greedy:
            log.warning("%s drafter: this request samples (temperature %g, top_k %d), and the %s chain is greedy "
                        "only; decoding it without drafting rather than serving the greedy stream",
                        drafter.kind, opts.sampler.temperature, opts.sampler.top_k, drafter.kind)
            return False
        return True

    def start_row(self, opts, sequence: list[int], seed: int, target_vocab: int, prefill_step: int) -> SpecRow:
        s = self.settings
        n_max = min(s.n_max, opts.spec_n_max) if getattr(opts, "spec_n_max", None) else s.n_max
        req_min = getattr(opts, "spec_n_min", None)
        n_min = min(n_max, req_min if req_min is not None else s.n_min)
        params: SamplerParams = opts.sampler
        drafter: Drafter
        if self.model_drafter is not None:
            drafter = copy.copy(self.model_drafter)  # shares the loaded network; start() makes fresh state
            drafter.start(sequence, params, seed)
            self._prime(drafter, sequence, prefill_step)
        elif s.kind == DRAFT_MODEL:
            drafter = DraftModelDrafter(self.draft, target_vocab_size=target_vocab, prefill_step=prefill_step)
            drafter.start(sequence, params, seed)
        else:
            drafter = GovernedPromptLookupDrafter(s.ngram_min, max(s.ngram_min, s.ngram_max), n_min=n_min,
                                                  adaptive=s.adaptive)
            drafter.start(sequence, params, seed)
        rule = select_rule(params, has_proposal_distribution=drafter.provides_distribution,
                           deterministic_proposals=drafter.deterministic,
                           argmax_verify=getattr(drafter, "argmax_verify", False),
                           stochastic=getattr(opts, "spec_stochastic", None))
        log.info("request speculates: %s drafter, rule=%s, block %d", drafter.kind, rule, n_max)
        return SpecRow(drafter=drafter, rule=rule, n_max=n_max, n_min=n_min, stats=DraftStats(kind=self.draft_kind))

    def _prime(self, drafter, sequence: list[int], prefill_step: int) -> None:
        """Hand a model-based drafter the hidden states of ``sequence[:-1]`` (what the row's cache
        holds), from one target pass over a fresh cache."""
        from mlxcel.engine.speculative.target_features import prefill_with_features

        context = sequence[:-1]
        if context:
            drafter.observe_target(prefill_with_features(self.target.model, context, self.target.make_cache(),
                                                         drafter.feature_layers, prefill_step))


def _materialize(drafter) -> None:
    """Evaluate every array the bound drafter holds, here on the loading thread: MLX records each
    lazy array against the creating thread's stream, and the engine thread cannot evaluate a graph
    recorded on another thread."""
    import mlx.core as mx
    import mlx.nn as nn

    seen: set[int] = set()
    arrays: list = []

    def walk(obj, depth=0):
        if depth > 4 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, mx.array):
            arrays.append(obj)
        elif isinstance(obj, nn.Module):
            arrays.extend(v for _, v in _flatten(obj.parameters()))
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, depth + 1)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v, depth + 1)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("mlxcel"):
            for v in vars(obj).values():
                walk(v, depth + 1)

    walk(drafter)
    mx.eval(arrays)


def _flatten(tree):
    from mlx.utils import tree_flatten

    return tree_flatten(tree)


def _rule_note(drafter) -> str:
    if getattr(drafter, "greedy_only", False):
        return "greedy-argmax at temperature 0; sampling requests decoded plainly"
    return "greedy-argmax at temperature 0, argmax-against-argmax above it unless stochastic acceptance is on"


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
