"""Every drafter kind, declared once, and the one way to choose and load a kind.

A :class:`DrafterKind` says what the command line calls it (``--draft-kind`` name, the upstream
``--spec-type`` names that select it), which round loop serves it (what a response's ``timings``
report as ``draft_kind``), what ``-md`` must be, how its drafter-only checkpoint is recognised by
structure, its default block, and whether it is greedy-only. The server's flags, ``mlxcel
generate``'s flags, every refusal message and the compat record read this table; nothing else
lists kinds.

:func:`choose` turns the speculative flags (``--spec-type``, ``--draft-kind``, ``-md``,
``--spec-default``) into one kind, exactly as both commands resolve them; ``loading.load`` loads
what that kind needs (a draft model, a drafter network bound to the target) once.

Structure, not names: a drafter-only checkpoint (DFlash, DSpark, the Muse Glimmer assistant, a
NextN MTP assistant) has no embeddings or LM head of its own, so it is never a standalone model.
It is recognised from its config.json by each kind's own detector (``dflash.checkpoint``,
``mtp.structure``); :func:`refuse_as_model` refuses such a directory as a target model, naming
the round loop that runs it (``loading.load_target`` passes it to the engine's loader).

The table is light on purpose: it imports no MLX model code, so the command line is checked, and a
bad one refused, before anything heavy loads. Loading is ``drafters.loading``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcel.drafters.dflash.structure import dflash_family
from mlxcel.drafters.mtp.structure import is_assistant_checkpoint
from mlxcel.engine.errors import MlxcelError, ModelLoadError

if TYPE_CHECKING:
    from mlxcel.engine.speculative.drafter import Drafter

SERVER_COMMAND = "mlxcel-server"
LOOKUP_NGRAM_MIN = 1  # shortest n-gram prompt lookup matches
LOOKUP_NGRAM_MAX = 3  # longest n-gram it tries first


class DrafterChoiceError(MlxcelError):
    """Speculative flags that cannot be honoured (shown as one ``error:`` line)."""


@dataclass(frozen=True)
class DrafterKind:
    """One drafter kind, as every flag, message and record refers to it."""

    name: str  # the --draft-kind name
    loop: str  # the round loop that serves it; what timings report as draft_kind
    spec_types: tuple[str, ...]  # upstream --spec-type names that select it
    summary: str  # one phrase, for help texts and the compat record
    flags: str  # how a command line asks for it
    draft_model: str  # what -md must be: "none", "file" (a model), "dir" (its checkpoint), "optional"
    drafter: str  # "module:Class" of the class that drafts for it; resolved on first use (drafter_class)
    structure: Callable[[dict], bool] | None = None  # recognises its drafter-only checkpoint
    default_block: int | None = None  # drafts per round by default; None: what the drafter declares
    exact: bool = True  # a request naming it insists on it (False: any checkpoint on its round loop)

    def drafter_class(self) -> type[Drafter]:
        """The drafter class, imported on first use: the table is read while the command line is
        checked, before anything loads, and the drafter modules pull in mlx-lm (and with it
        transformers), a second or more of imports a refused command line should not pay."""
        module, name = self.drafter.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def greedy_only(self) -> bool:
        """Sampling requests are declined and decoded plainly (the drafter class's own trait)."""
        return self.drafter_class().greedy_only

    @property
    def model_based(self) -> bool:
        """A drafter network that reads the target's hidden states (a ``ModelDrafter``)."""
        return self.loop in (DFLASH_LOOP, MTP_LOOP)


DFLASH_LOOP = "dflash"
MTP_LOOP = "mtp"

PROMPT_LOOKUP = DrafterKind(
    "prompt-lookup", "prompt-lookup", ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"),
    "copies what followed an earlier occurrence of the last n tokens (no second model)",
    "--spec-type ngram-simple", "none", "mlxcel.drafters.lookup.prompt_lookup:PromptLookupDrafter", default_block=32)
DRAFT_MODEL = DrafterKind(
    "draft-model", "draft-model", ("draft-simple",), "a small model sharing the target's vocabulary",
    "--spec-type draft-simple -md FILE", "file", "mlxcel.drafters.draft_model:DraftModelDrafter", default_block=3)
DFLASH = DrafterKind(
    "dflash", DFLASH_LOOP, ("draft-dflash",), "a DFlash block drafter reading the target's hidden states",
    "--spec-type draft-dflash -md DIR", "dir", "mlxcel.drafters.dflash.drafter:DFlashDrafter", lambda c: dflash_family(c) == "dflash", exact=False)
DSPARK = DrafterKind(
    "dspark", DFLASH_LOOP, ("draft-dspark",), "an LFM2 DSpark drafter (greedy chains only)",
    "--spec-type draft-dspark -md DIR", "dir", "mlxcel.drafters.dflash.dspark:DSparkDrafter", lambda c: dflash_family(c) == "dspark")
MUSE_GLIMMER = DrafterKind(
    "muse-glimmer", DFLASH_LOOP, (), "the Muse Glimmer assistant (widens its block when it pays)",
    "--draft-kind muse-glimmer -md DIR", "dir", "mlxcel.drafters.dflash.muse_glimmer:MuseGlimmerDrafter", lambda c: dflash_family(c) == "muse-glimmer")
MTP = DrafterKind(
    "mtp", MTP_LOOP, ("draft-mtp",), "multi-token-prediction layers: the target's own, or a NextN assistant",
    "--spec-type draft-mtp [-md DIR]", "optional", "mlxcel.drafters.mtp.drafter:MtpDrafter", is_assistant_checkpoint, exact=False)
INTERNAL_MTP = DrafterKind(
    "internal-mtp", MTP_LOOP, (), "the target's own multi-token-prediction layers",
    "--draft-kind internal-mtp", "none", "mlxcel.drafters.mtp.drafter:MtpDrafter")

KINDS: tuple[DrafterKind, ...] = (PROMPT_LOOKUP, DRAFT_MODEL, DFLASH, DSPARK, MUSE_GLIMMER, MTP, INTERNAL_MTP)
BY_NAME = {k.name: k for k in KINDS}
BY_SPEC_TYPE = {t: k for k in KINDS for t in k.spec_types}
# Upstream's --spec-type names that select no kind here.
SPEC_TYPE_NONE = "none"
SPEC_TYPE_REFUSED = {"draft-eagle3": "EAGLE-3 drafters are not implemented in mlxcel; use draft-dflash, draft-mtp, "
                                     "draft-simple with -md, or ngram-simple"}
SPEC_TYPES = (SPEC_TYPE_NONE, *BY_SPEC_TYPE, *SPEC_TYPE_REFUSED)


def kind_names() -> str:
    return ", ".join(BY_NAME)


def upstream_type(kind: DrafterKind) -> str:
    """The upstream ``--spec-type`` name a server running ``kind`` answers to (``speculative.types``)."""
    if kind.spec_types:
        return kind.spec_types[0]
    return next(k.spec_types[0] for k in KINDS if k.loop == kind.loop and k.spec_types)


# -- checkpoints by structure ---------------------------------------------------------------------


def read_drafter_config(path: str | Path) -> dict:
    """config.json of a drafter directory; ``{}`` for a single-file (GGUF) drafter or a path
    without one (loading then reports what is wrong)."""
    config_file = Path(path).expanduser() / "config.json"
    if not config_file.is_file():
        return {}
    try:
        return json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def checkpoint_kind(config: dict) -> DrafterKind | None:
    """The drafter-only kind a config.json describes by structure, or None for an ordinary model."""
    for kind in KINDS:
        if kind.structure is not None and kind.structure(config):
            return kind
    return None


def refuse_as_model(path: Path, config: dict) -> None:
    """``engine.model.loading``'s config check: a drafter-only checkpoint is not a model."""
    kind = checkpoint_kind(config)
    if kind is not None:
        raise ModelLoadError(
            f"{path} is a {kind.name} drafter checkpoint, not a standalone model: it borrows the target's "
            f"embeddings and head. Pass a full model to -m, and this directory as its drafter (-md DIR, served "
            f"on the {_loop_title(kind)} round loop).")


def _loop_title(kind: DrafterKind) -> str:
    return {DFLASH_LOOP: "DFlash", MTP_LOOP: "MTP"}.get(kind.loop, kind.loop)


# -- choosing a kind from the flags ---------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """What the speculative flags resolved to."""

    kind: DrafterKind
    draft_model: str | None = None
    draft_hf: str | None = None
    notes: tuple[str, ...] = ()  # what the resolution decided on the user's behalf, for the log


def choose(*, spec_types: list[str] | tuple[str, ...] = (), draft_kind: str | None = None,
           draft_model: str | None = None, draft_hf: str | None = None,
           spec_default: bool = False) -> Choice | None:
    """The one kind the flags ask for (None: no speculation), or :class:`DrafterChoiceError`.

    ``--spec-type`` and ``--draft-kind`` name a round loop and possibly one kind on it; ``-md``
    alone selects by structure (a drafter-only checkpoint runs on its round loop, an ordinary
    model drafts as a draft model); ``--spec-default`` asks for prompt lookup."""
    notes: list[str] = []
    named: dict[str, DrafterKind] = {}  # round loop -> the kind named for it

    def name(kind: DrafterKind, flag: str) -> None:
        """Hold ``kind`` for its loop; of two names for one loop the exact one wins."""
        held = named.get(kind.loop)
        if held is not None and held is not kind and held.exact and kind.exact:
            raise DrafterChoiceError(f"{flag} contradicts the other speculative flags ({held.name})")
        if held is None or kind.exact:
            named[kind.loop] = kind

    for t in spec_types:
        if t == SPEC_TYPE_NONE:
            continue
        if t in SPEC_TYPE_REFUSED:
            raise DrafterChoiceError(f"--spec-type {t}: {SPEC_TYPE_REFUSED[t]}")
        if t not in BY_SPEC_TYPE:
            raise DrafterChoiceError(f"--spec-type {t!r}: unknown type (choose from {', '.join(SPEC_TYPES)})")
        name(BY_SPEC_TYPE[t], f"--spec-type {t}")
        if BY_SPEC_TYPE[t] is PROMPT_LOOKUP and t != PROMPT_LOOKUP.spec_types[0]:
            notes.append(f"--spec-type {t} is served by prompt lookup (ngram-simple): same output, "
                         "possibly different speed")
    if draft_kind:
        kind = BY_NAME.get(draft_kind.strip().lower())
        if kind is None:
            raise DrafterChoiceError(f"--draft-kind {draft_kind!r}: unknown kind (choose from {kind_names()})")
        name(kind, f"--draft-kind {kind.name}")
    if spec_default and not named:
        named[PROMPT_LOOKUP.loop] = PROMPT_LOOKUP
    has_model = bool(draft_model or draft_hf)
    structure = checkpoint_kind(read_drafter_config(draft_model)) if draft_model else None
    if has_model and not named:
        if structure is not None:
            named[structure.loop] = structure
            notes.append(f"-md is a {structure.name} drafter checkpoint: serving it on the "
                         f"{_loop_title(structure)} round loop")
        else:
            named[DRAFT_MODEL.loop] = DRAFT_MODEL
            notes.append("-md without --spec-type: drafting with the draft model (draft-simple); upstream would "
                         "load it and never draft")
    if len(named) > 1:
        raise DrafterChoiceError(f"one drafter at a time: the flags ask for {' and '.join(sorted(named))}")
    if not named:
        return None
    (kind,) = named.values()
    kind = _checked(kind, structure, draft_model, draft_hf)
    return Choice(kind, draft_model=draft_model, draft_hf=draft_hf, notes=tuple(notes))


def _checked(kind: DrafterKind, structure: DrafterKind | None, draft_model: str | None,
             draft_hf: str | None) -> DrafterKind:
    """The concrete kind, once ``-md`` is checked against what ``kind`` needs."""
    has_model = bool(draft_model or draft_hf)
    if kind is DRAFT_MODEL:
        if not has_model:
            raise DrafterChoiceError("--spec-type draft-simple needs a draft model: pass -md/--spec-draft-model FILE")
        if structure is not None:
            raise DrafterChoiceError(
                f"{draft_model} is a {structure.name} drafter checkpoint (no embeddings or LM head of its own), "
                f"not a draft model; run it with {structure.flags.replace('DIR', str(draft_model))} (or -md alone)")
        return kind
    if kind is PROMPT_LOOKUP:
        if has_model:
            raise DrafterChoiceError("prompt lookup needs no draft model; drop -md or use --spec-type draft-simple")
        return kind
    if kind.loop == DFLASH_LOOP:
        if not draft_model:
            raise DrafterChoiceError("the DFlash round loop needs its drafter: pass -md DIR (a DFlash, DSpark or "
                                     "Muse Glimmer assistant checkpoint directory)")
        if structure is None or structure.loop != DFLASH_LOOP:
            raise DrafterChoiceError(
                f"{draft_model} is not a DFlash, DSpark or Muse Glimmer assistant checkpoint (its config.json has "
                "no dflash_config, DFlashDraftModel, Lfm2DSparkDraftModel or muse_glimmer_assistant); an ordinary "
                "small model drafts with --spec-type draft-simple")
        if kind.exact and structure is not kind:
            raise DrafterChoiceError(f"{kind.name} was asked for, but {draft_model} is a {structure.name} "
                                     "drafter checkpoint")
        return structure
    # the MTP round loop
    if kind is INTERNAL_MTP and draft_model:
        raise DrafterChoiceError("--draft-kind internal-mtp uses the target's own MTP layers; drop -md")
    if draft_hf and not draft_model:
        raise DrafterChoiceError("an MTP assistant is read from a local directory: pass -md DIR")
    if draft_model and structure is not MTP:
        what = (f"a {structure.name} drafter checkpoint" if structure
                else "not a NextN MTP assistant or Gemma 4 assistant checkpoint")
        raise DrafterChoiceError(f"--spec-type draft-mtp: {draft_model} is {what}; pass an MTP assistant to -md, "
                                 "or no -md to use the target's own MTP layers")
    return MTP if draft_model else INTERNAL_MTP


@dataclass(frozen=True)
class LookupOptions:
    """Prompt lookup's settings: n-gram bounds, and whether the server's governor runs."""

    ngram_min: int = LOOKUP_NGRAM_MIN
    ngram_max: int = LOOKUP_NGRAM_MAX
    governed: bool = False  # the server's pause policy (drafters.lookup.governor); off: the CLI's
    adaptive: bool = True
