"""Every drafter kind, declared once, and the one way to choose and load a kind.

A :class:`DrafterKind` says what the command line calls it (``--draft-kind`` name, the upstream
``--spec-type`` names that select it), which round loop serves it (what a response's ``timings``
report as ``draft_kind``), what ``-md`` must be and how it is checked, how its drafter-only
checkpoint is recognised by structure, its default block, its drafter class (and so whether it is
greedy-only), its loader, and whether it is model-based. The server's flags, ``mlxcel generate``'s
flags, every refusal message and the compat record read this table; nothing else lists kinds, and
nothing else names a kind's class or loader. A new kind is one :func:`register` call plus its
package.

:func:`choose` turns the speculative flags (``--spec-type``, ``--draft-kind``, ``-md``,
``--spec-default``) into one kind, exactly as both commands resolve them; ``drafters.drafter_setup.set_up``
loads what that kind needs (through its loader, ``drafters.loading.load``) once, for both. The n-gram
kinds (``combines``) may be named together, as upstream allows: they become one :class:`CombinedKind`
whose rounds ask them in registration order.

Structure, not names: a drafter-only checkpoint (DFlash, DSpark, the Muse Glimmer assistant, a
NextN MTP assistant, EAGLE-3) has no embeddings or LM head of its own (or, for EAGLE-3, no stack
of target layers to read), so it is never a standalone model. It is recognised from its
config.json by each kind's own detector (``dflash.structure``, ``mtp.structure``,
``eagle3.structure``; a GGUF drafter by its architecture, ``gguf_header``); :func:`refuse_as_model`
refuses such a directory as a target model, naming the round loop that runs it
(``loading.load_target`` passes it to the engine's loader).

The table is light on purpose: it imports no MLX model code, so the command line is checked, and a
bad one refused, before anything heavy loads. Loading is ``drafters.loading``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcel.drafters.dflash.structure import dflash_family
from mlxcel.drafters.eagle3.structure import is_eagle3
from mlxcel.drafters.gguf_header import ARCHITECTURE_KEY, gguf_architecture
from mlxcel.drafters.lookup.options import (
    CACHE_BLOCK,
    NgramCacheOptions,
    NgramMapOptions,
    NgramModOptions,
)
from mlxcel.drafters.mtp.structure import is_assistant_checkpoint
from mlxcel.engine.errors import MlxcelError, ModelLoadError

if TYPE_CHECKING:
    from mlxcel.drafters.source import DrafterSource, SourceRequest
    from mlxcel.engine.speculative.drafter import Drafter, ModelDrafter

SERVER_COMMAND = "mlxcel-server"
LOOKUP_NGRAM_MIN = 1  # shortest n-gram prompt lookup matches
LOOKUP_NGRAM_MAX = 3  # longest n-gram it tries first


class DrafterChoiceError(MlxcelError):
    """Speculative flags that cannot be honoured (shown as one ``error:`` line)."""


@dataclass(frozen=True)
class DraftModelFlag:
    """What ``-md`` / ``-hfd`` gave, and the drafter-only kind the ``-md`` checkpoint is by structure."""

    path: str | None = None
    hf: str | None = None
    structure: DrafterKind | None = None

    @property
    def given(self) -> bool:
        return bool(self.path or self.hf)


def refuse_draft_model(kind: DrafterKind, md: DraftModelFlag) -> DrafterKind:
    """The check of a kind that drafts without a second model (the default)."""
    if md.given:
        raise DrafterChoiceError(f"{kind.name} needs no draft model; drop -md")
    return kind


@dataclass(frozen=True)
class DrafterKind:
    """One drafter kind, as every flag, message and record refers to it.

    Everything a kind is, it declares here: ``drafter`` is its class and ``load`` its loader, both
    ``"module:name"`` strings resolved on first use (:meth:`drafter_class`, :meth:`loader`: the
    table is read while the command line is checked, before anything loads, and the drafter modules
    pull in mlx-lm and with it transformers, a second or more of imports a refused command line
    should not pay). The loader is handed a ``source.SourceRequest`` and returns a
    ``source.DrafterSource``, or, for a ``model_based`` kind, its network (a ``ModelDrafter``) that
    ``loading`` binds to the target. ``check`` turns the kind the flags named into the concrete one
    once ``-md`` is checked against it (:meth:`checked`)."""

    name: str  # the --draft-kind name
    loop: str  # the round loop that serves it; what timings report as draft_kind
    spec_types: tuple[str, ...]  # upstream --spec-type names that select it
    summary: str  # one phrase, for help texts and the compat record
    flags: str  # how a command line asks for it
    draft_model: str  # what -md must be: "none", "file" (a model), "dir" (its checkpoint), "optional"
    drafter: str  # "module:Class" of the class that drafts for it
    load: str  # "module:function" of its loader
    structure: Callable[[dict], bool] | None = None  # recognises its drafter-only checkpoint
    default_block: int | None = None  # drafts per round by default; None: what the drafter declares
    exact: bool = True  # a request naming it insists on it (False: any checkpoint on its round loop)
    model_based: bool = False  # a network reading the target's hidden states (its class is a ModelDrafter)
    check: Callable[[DrafterKind, DraftModelFlag], DrafterKind] = refuse_draft_model
    combines: bool = False  # an n-gram kind: several run together (--spec-type a,b), asked in registration order

    def drafter_class(self) -> type[Drafter]:
        """The drafter class, imported on first use."""
        return _resolve(self.drafter)

    def loader(self) -> Callable[[SourceRequest], DrafterSource | ModelDrafter]:
        """The loader, imported on first use."""
        return _resolve(self.load)

    def checked(self, md: DraftModelFlag) -> DrafterKind:
        """The concrete kind, once ``-md`` is checked against what this kind needs
        (:class:`DrafterChoiceError` when it cannot serve)."""
        return self.check(self, md)

    @property
    def greedy_only(self) -> bool:
        """Sampling requests are declined and decoded plainly (the drafter class's own trait)."""
        return self.drafter_class().greedy_only


def _resolve(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


DFLASH_LOOP = "dflash"
MTP_LOOP = "mtp"
EAGLE3_LOOP = "eagle3"


# -- each kind's check of -md ---------------------------------------------------------------------


def _lookup_check(kind: DrafterKind, md: DraftModelFlag) -> DrafterKind:
    if md.given:
        raise DrafterChoiceError(f"{'prompt lookup' if kind is PROMPT_LOOKUP else kind.name} needs no draft model; "
                                 "drop -md or use --spec-type draft-simple")
    return kind


def _draft_model_check(kind: DrafterKind, md: DraftModelFlag) -> DrafterKind:
    if not md.given:
        raise DrafterChoiceError("--spec-type draft-simple needs a draft model: pass -md/--spec-draft-model FILE")
    if md.structure is not None:
        raise DrafterChoiceError(
            f"{md.path} is a {md.structure.name} drafter checkpoint (no embeddings or LM head of its own), "
            f"not a draft model; run it with {md.structure.flags.replace('DIR', str(md.path))} (or -md alone)")
    return kind


def _dflash_check(kind: DrafterKind, md: DraftModelFlag) -> DrafterKind:
    """Any kind on the DFlash round loop: the checkpoint's structure says which one it is."""
    if not md.path:
        raise DrafterChoiceError("the DFlash round loop needs its drafter: pass -md DIR (a DFlash, DSpark or "
                                 "Muse Glimmer assistant checkpoint directory)")
    structure = md.structure
    if structure is None or structure.loop != DFLASH_LOOP:
        raise DrafterChoiceError(
            f"{md.path} is not a DFlash, DSpark or Muse Glimmer assistant checkpoint (its config.json has "
            "no dflash_config, DFlashDraftModel, Lfm2DSparkDraftModel or muse_glimmer_assistant); an ordinary "
            "small model drafts with --spec-type draft-simple")
    if kind.exact and structure is not kind:
        raise DrafterChoiceError(f"{kind.name} was asked for, but {md.path} is a {structure.name} "
                                 "drafter checkpoint")
    return structure


def _mtp_check(kind: DrafterKind, md: DraftModelFlag) -> DrafterKind:
    """Either kind on the MTP round loop: an assistant checkpoint given is MTP, none is INTERNAL_MTP."""
    if kind is INTERNAL_MTP and md.path:
        raise DrafterChoiceError("--draft-kind internal-mtp uses the target's own MTP layers; drop -md")
    if md.hf and not md.path:
        raise DrafterChoiceError("an MTP assistant is read from a local directory: pass -md DIR")
    if md.path and md.structure is not MTP:
        what = (f"a {md.structure.name} drafter checkpoint" if md.structure
                else "not a NextN MTP assistant or Gemma 4 assistant checkpoint")
        raise DrafterChoiceError(f"--spec-type draft-mtp: {md.path} is {what}; pass an MTP assistant to -md, "
                                 "or no -md to use the target's own MTP layers")
    return MTP if md.path else INTERNAL_MTP


def _eagle3_check(kind: DrafterKind, md: DraftModelFlag) -> DrafterKind:
    """EAGLE-3 reads its drafter from a local checkpoint directory or GGUF file, recognised by structure."""
    if not md.path:
        raise DrafterChoiceError("--spec-type draft-eagle3 needs its drafter: pass -md DIR (an EAGLE-3 checkpoint "
                                 "directory, or the GGUF llama.cpp converts one to)"
                                 + ("; -hfd is not read for it" if md.hf else ""))
    if md.structure is not kind:
        what = (f"a {md.structure.name} drafter checkpoint" if md.structure
                else "not an EAGLE-3 drafter (its config.json names no LlamaForCausalLMEagle3 or Eagle3Speculator, "
                     "no speculators_config for eagle3, no draft_vocab_size with one layer; a GGUF is not of "
                     "architecture eagle3)")
        raise DrafterChoiceError(f"--spec-type draft-eagle3: {md.path} is {what}")
    return kind


# -- the table ------------------------------------------------------------------------------------

KINDS: list[DrafterKind] = []  # in registration order; grown in place by register()
BY_NAME: dict[str, DrafterKind] = {}
BY_SPEC_TYPE: dict[str, DrafterKind] = {}
# Upstream's --spec-type names that select no kind here.
SPEC_TYPE_NONE = "none"
SPEC_TYPE_REFUSED: dict[str, str] = {}  # name -> why (none today)
SPEC_TYPES: list[str] = [SPEC_TYPE_NONE, *SPEC_TYPE_REFUSED]  # every --spec-type name, the refused ones last


def register(kind: DrafterKind) -> DrafterKind:
    """Add ``kind`` to the table: the one entry point, so a new kind is one call to this plus its
    package. Names and ``--spec-type`` names must be new."""
    if kind.name in BY_NAME:
        raise ValueError(f"drafter kind {kind.name!r} is already registered")
    taken = [t for t in kind.spec_types if t in BY_SPEC_TYPE or t in SPEC_TYPE_REFUSED or t == SPEC_TYPE_NONE]
    if taken:
        raise ValueError(f"--spec-type {', '.join(taken)} already selects another kind")
    KINDS.append(kind)
    BY_NAME[kind.name] = kind
    BY_SPEC_TYPE.update((t, kind) for t in kind.spec_types)
    SPEC_TYPES[:] = [SPEC_TYPE_NONE, *BY_SPEC_TYPE, *SPEC_TYPE_REFUSED]
    return kind


# The n-gram kinds (combines=True) are registered in upstream's order of preference: prompt lookup
# (ngram-simple) first, the others after the model kinds; combined (--spec-type a,b), they are asked in
# this order and the first that drafts serves the round (lookup.combined).
PROMPT_LOOKUP = register(DrafterKind(
    "prompt-lookup", "prompt-lookup", ("ngram-simple",),
    "copies what followed an earlier occurrence of the last n tokens (no second model)", "--spec-type ngram-simple",
    "none", "mlxcel.drafters.lookup.prompt_lookup:PromptLookupDrafter", "mlxcel.drafters.lookup.source:load_source",
    default_block=32, check=_lookup_check, combines=True))
DRAFT_MODEL = register(DrafterKind(
    "draft-model", "draft-model", ("draft-simple",), "a small model sharing the target's vocabulary",
    "--spec-type draft-simple -md FILE", "file", "mlxcel.drafters.draft_model:DraftModelDrafter",
    "mlxcel.drafters.draft_model_source:load_source", default_block=3, check=_draft_model_check))
DFLASH = register(DrafterKind(
    "dflash", DFLASH_LOOP, ("draft-dflash",), "a DFlash block drafter reading the target's hidden states",
    "--spec-type draft-dflash -md DIR", "dir", "mlxcel.drafters.dflash.drafter:DFlashDrafter",
    "mlxcel.drafters.dflash.source:load_network", lambda c: dflash_family(c) == "dflash", exact=False,
    model_based=True, check=_dflash_check))
DSPARK = register(DrafterKind(
    "dspark", DFLASH_LOOP, ("draft-dspark",), "an LFM2 DSpark drafter (greedy chains only)",
    "--spec-type draft-dspark -md DIR", "dir", "mlxcel.drafters.dflash.dspark:DSparkDrafter",
    "mlxcel.drafters.dflash.source:load_network", lambda c: dflash_family(c) == "dspark",
    model_based=True, check=_dflash_check))
MUSE_GLIMMER = register(DrafterKind(
    "muse-glimmer", DFLASH_LOOP, (), "the Muse Glimmer assistant (widens its block when it pays)",
    "--draft-kind muse-glimmer -md DIR", "dir", "mlxcel.drafters.dflash.muse_glimmer:MuseGlimmerDrafter",
    "mlxcel.drafters.dflash.source:load_network", lambda c: dflash_family(c) == "muse-glimmer",
    model_based=True, check=_dflash_check))
MTP = register(DrafterKind(
    "mtp", MTP_LOOP, ("draft-mtp",), "multi-token-prediction layers: the target's own, or a NextN assistant",
    "--spec-type draft-mtp [-md DIR]", "optional", "mlxcel.drafters.mtp.drafter:MtpDrafter",
    "mlxcel.drafters.mtp.source:load_network", is_assistant_checkpoint, exact=False,
    model_based=True, check=_mtp_check))
INTERNAL_MTP = register(DrafterKind(
    "internal-mtp", MTP_LOOP, (), "the target's own multi-token-prediction layers",
    "--draft-kind internal-mtp", "none", "mlxcel.drafters.mtp.drafter:MtpDrafter",
    "mlxcel.drafters.mtp.source:load_network", model_based=True, check=_mtp_check))
EAGLE3 = register(DrafterKind(
    "eagle3", EAGLE3_LOOP, ("draft-eagle3",), "an EAGLE-3 drafter: one layer over three of the target's hidden states",
    "--spec-type draft-eagle3 -md DIR", "dir", "mlxcel.drafters.eagle3.drafter:Eagle3Drafter",
    "mlxcel.drafters.eagle3.source:load_network", is_eagle3, model_based=True, check=_eagle3_check))
NGRAM_MAP_K = register(DrafterKind(
    "ngram-map-k", "ngram-map-k", ("ngram-map-k",),
    "copies what followed the last n-token key, as many tokens as that key had accepted last time",
    "--spec-type ngram-map-k", "none", "mlxcel.drafters.lookup.ngram_map:NgramMapKDrafter",
    "mlxcel.drafters.lookup.source:load_map", default_block=NgramMapOptions().size_m, check=_lookup_check,
    combines=True))
NGRAM_MAP_K4V = register(DrafterKind(
    "ngram-map-k4v", "ngram-map-k4v", ("ngram-map-k4v",),
    "drafts the continuation that most often followed the last n-token key (up to four kept per key)",
    "--spec-type ngram-map-k4v", "none", "mlxcel.drafters.lookup.ngram_map:NgramMapK4vDrafter",
    "mlxcel.drafters.lookup.source:load_map", default_block=NgramMapOptions().size_m, check=_lookup_check,
    combines=True))
NGRAM_MOD = register(DrafterKind(
    "ngram-mod", "ngram-mod", ("ngram-mod",),
    "chains next-token lookups in one hashed n-gram table the whole server shares",
    "--spec-type ngram-mod", "none", "mlxcel.drafters.lookup.ngram_mod:NgramModDrafter",
    "mlxcel.drafters.lookup.source:load_mod", default_block=NgramModOptions().n_max, check=_lookup_check,
    combines=True))
NGRAM_CACHE = register(DrafterKind(
    "ngram-cache", "ngram-cache", ("ngram-cache",),
    "drafts the most frequent next token of n-gram statistics a slot keeps across its requests (-lcs/-lcd files)",
    "--spec-type ngram-cache", "none", "mlxcel.drafters.lookup.ngram_cache:NgramCacheDrafter",
    "mlxcel.drafters.lookup.source:load_cache", default_block=CACHE_BLOCK, check=_lookup_check, combines=True))


def kind_names() -> str:
    return ", ".join(BY_NAME)


def upstream_type(kind: DrafterKind) -> str:
    """The upstream ``--spec-type`` name a server running ``kind`` answers to (``speculative.types``): its
    own, else its round loop's; a kind on a loop upstream has no name for answers to its own name; combined
    n-gram kinds, their names as the command line gave them, comma-separated (as upstream lists them)."""
    if isinstance(kind, CombinedKind):
        return ",".join(kind.spec_types)
    if kind.spec_types:
        return kind.spec_types[0]
    return next((k.spec_types[0] for k in KINDS if k.loop == kind.loop and k.spec_types), kind.name)


# -- checkpoints by structure ---------------------------------------------------------------------


def read_drafter_config(path: str | Path) -> dict:
    """config.json of a drafter directory; for a GGUF file, its architecture as
    ``{"general.architecture": name}`` (all a structural detector needs of it, read from the header's
    first keys); ``{}`` for a path with neither (loading then reports what is wrong)."""
    path = Path(path).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        arch = gguf_architecture(path)
        return {ARCHITECTURE_KEY: arch} if arch else {}
    config_file = path / "config.json"
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
    return {DFLASH_LOOP: "DFlash", MTP_LOOP: "MTP", EAGLE3_LOOP: "EAGLE-3"}.get(kind.loop, kind.loop)


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
    if not named:
        return None
    kind = _one_kind(list(named.values()), spec_types)
    kind = kind.checked(DraftModelFlag(draft_model, draft_hf, structure))
    return Choice(kind, draft_model=draft_model, draft_hf=draft_hf, notes=tuple(notes))


def _one_kind(named: list[DrafterKind], spec_types: list[str] | tuple[str, ...]) -> DrafterKind:
    """The kind the named ones make: the one named, or several n-gram kinds combined."""
    if len(named) == 1:
        return named[0]
    if not all(k.combines for k in named):
        raise DrafterChoiceError(f"one drafter at a time: the flags ask for {' and '.join(sorted(k.loop for k in named))} "
                                 f"(only the n-gram types combine: {', '.join(combinable_types())})")
    return combine(named, spec_types)


def combinable_types() -> list[str]:
    """The --spec-type names that may be given together, in the order a combination asks them."""
    return [t for k in KINDS if k.combines for t in k.spec_types]


@dataclass(frozen=True)
class CombinedKind(DrafterKind):
    """Several n-gram kinds on one server, as upstream runs ``--spec-type a,b``: every round asks them in
    registration order (upstream's preference: ngram-simple, map-k, map-k4v, mod, cache) and the first
    that drafts serves it (``lookup.combined``). Made by :func:`choose`, never registered; its loader
    loads every member through the member's own loader and hands the sources to its ``load``."""

    members: tuple[DrafterKind, ...] = ()

    def loader(self) -> Callable[[SourceRequest], DrafterSource]:
        join = _resolve(self.load)

        def load(request: SourceRequest) -> DrafterSource:
            return join([m.loader()(replace(request, drafter=m.drafter_class(), default_block=m.default_block))
                         for m in self.members])
        return load


def combine(kinds: list[DrafterKind], spec_types: list[str] | tuple[str, ...] = ()) -> CombinedKind:
    """``kinds`` (n-gram kinds) as one: members in registration order; its ``spec_types`` are the names
    ``spec_types`` gave, in that order, then any member's not given there (one named by --draft-kind)."""
    members = tuple(sorted(set(kinds), key=KINDS.index))
    given = [t for t in dict.fromkeys(spec_types) if BY_SPEC_TYPE.get(t) in members]
    types = (*given, *(m.spec_types[0] for m in members if not set(m.spec_types) & set(given)))
    return CombinedKind(
        "+".join(m.name for m in members), "+".join(m.loop for m in members), types,
        "the first of " + ", ".join(types) + " that drafts, each round", "--spec-type " + ",".join(types), "none",
        "mlxcel.drafters.lookup.combined:CombinedDrafter", "mlxcel.drafters.lookup.combined:combine_sources",
        check=_lookup_check, combines=True, members=members)


@dataclass(frozen=True)
class LookupOptions:
    """The n-gram kinds' settings: prompt lookup's n-gram bounds, block and whether the server's governor
    runs; each upstream n-gram type's own parameters (``--spec-ngram-*``, ``-lcs`` / ``-lcd``)."""

    ngram_min: int = LOOKUP_NGRAM_MIN
    ngram_max: int = LOOKUP_NGRAM_MAX
    governed: bool = False  # the server's pause policy (drafters.lookup.governor); off: the CLI's
    adaptive: bool = True
    block: int | None = None  # prompt lookup's block cap (--spec-ngram-simple-size-m); None: the kind's
    map_k: NgramMapOptions = NgramMapOptions()
    map_k4v: NgramMapOptions = NgramMapOptions()
    mod: NgramModOptions = NgramModOptions()
    cache: NgramCacheOptions = NgramCacheOptions()
