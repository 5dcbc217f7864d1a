"""Loading what a chosen drafter kind needs, once, into a :class:`DrafterSource` that makes one
fresh drafter per sequence: a draft model (checked against the target's vocabulary), a drafter
network bound to the target, or nothing (prompt lookup). Also :func:`load_target`, the engine's
model loader with drafter-only checkpoints refused (``registry.refuse_as_model``)."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel.drafters.dflash.drafter import DFlashDrafter
from mlxcel.drafters.dflash.dspark import DSparkDrafter
from mlxcel.drafters.dflash.muse_glimmer import MuseGlimmerDrafter
from mlxcel.drafters.dflash.structure import dflash_family
from mlxcel.drafters.draft_model import DraftModelDrafter, check_same_vocabulary
from mlxcel.drafters.lookup.governor import GovernedPromptLookupDrafter
from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
from mlxcel.drafters.mtp.drafter import MtpDrafter
from mlxcel.drafters.mtp.gemma4_assistant import Gemma4AssistantDrafter
from mlxcel.drafters.mtp.structure import is_gemma4_assistant
from mlxcel.drafters.registry import (
    DRAFT_MODEL,
    MTP_LOOP,
    PROMPT_LOOKUP,
    Choice,
    DrafterKind,
    LookupOptions,
    read_drafter_config,
    refuse_as_model,
)
from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.speculative.drafter import Drafter, ModelDrafter

log = logging.getLogger(__name__)


def load_target(model: str | Path | None = None, *, hf_repo: str | None = None,
                hf_file: str | None = None, shard: Callable[[nn.Module], None] | None = None) -> LoadedModel:
    """``engine.model.loading.load_model`` for a model that is to be served or verified against:
    a drafter-only checkpoint is refused with a message naming where it runs."""
    return load_model(model, hf_repo=hf_repo, hf_file=hf_file, check_config=refuse_as_model, shard=shard)


class DrafterSource:
    """A loaded kind: makes one fresh drafter per sequence (:meth:`new`). ``declared_block`` is
    the kind's default block once loaded (a model-based drafter's is its checkpoint's)."""

    def __init__(self, kind: DrafterKind, make: Callable[[int, int | None], Drafter], declared_block: int,
                 description: str, model_drafter: ModelDrafter | None = None):
        self.kind = kind
        self._make = make
        self.declared_block = declared_block
        self.description = description
        self.model_drafter = model_drafter  # the bound network every sequence's drafter shares

    def new(self, n_min: int = 0, ngram_max: int | None = None) -> Drafter:
        """A drafter for one sequence; ``n_min`` lets a drafter retract blocks too short to verify, and
        ``ngram_max`` (prompt lookup only) overrides the longest n-gram it matches."""
        return self._make(n_min, ngram_max)


def load(choice: Choice, target: LoadedModel, *, lookup: LookupOptions = LookupOptions(),
         prefill_step: int = 512) -> DrafterSource:
    """Load what ``choice`` needs against ``target`` (at startup, so no request pays the disk load)."""
    start = time.perf_counter()
    kind = choice.kind
    if kind is PROMPT_LOOKUP:
        return _lookup_source(lookup)
    if kind is DRAFT_MODEL:
        draft = load_target(choice.draft_model, hf_repo=choice.draft_hf)
        check_same_vocabulary(target, draft)
        return DrafterSource(
            kind, lambda n_min, _: DraftModelDrafter(draft, target_vocab_size=target.vocab_size, prefill_step=prefill_step),
            kind.default_block, f"draft-model {draft.name} in {time.perf_counter() - start:.2f} s")
    drafter = load_model_drafter(choice.draft_model, kind, target, prefill_step=prefill_step)
    drafter.bind(target.model)
    _materialize(drafter)
    where = choice.draft_model or "the target's own MTP layers"
    if drafter.feature_layers:
        where += f", reads target layers {list(drafter.feature_layers)}"
    return DrafterSource(kind, lambda n_min, _: copy.copy(drafter), drafter.declared_block,
                         f"{drafter.kind} ({where}) in {time.perf_counter() - start:.2f} s", model_drafter=drafter)


def _lookup_source(lookup: LookupOptions) -> DrafterSource:
    lo, hi = lookup.ngram_min, max(lookup.ngram_min, lookup.ngram_max)
    if lookup.governed:
        def make(n_min: int, ngram_max: int | None) -> Drafter:
            return GovernedPromptLookupDrafter(lo, max(lo, ngram_max or hi), n_min=n_min, adaptive=lookup.adaptive)
        how = f"adaptive {'on' if lookup.adaptive else 'off'}"
    else:
        def make(n_min: int, ngram_max: int | None) -> Drafter:
            return PromptLookupDrafter(lo, max(lo, ngram_max or hi))
        how = "pauses after a block with nothing accepted"
    return DrafterSource(PROMPT_LOOKUP, make, PROMPT_LOOKUP.default_block,
                         f"prompt-lookup (n-gram {lo}..{hi}, {how})")


def load_model_drafter(path: str | Path | None, kind: DrafterKind | None = None, target: LoadedModel | None = None,
                       *, target_vocab_size: int | None = None, prefill_step: int = 512) -> ModelDrafter:
    """The model-based drafter a checkpoint describes (DFlash, DSpark or Muse Glimmer assistant by
    structure; for the MTP kinds the target's own layers or a NextN assistant), loaded, not bound."""
    if kind is not None and kind.loop == MTP_LOOP:
        if path and is_gemma4_assistant(read_drafter_config(path)):
            return Gemma4AssistantDrafter.load(path)
        if target is None:
            raise ValueError("an MTP drafter is read against its target")
        return MtpDrafter.load(target.path, path, prefill_step=prefill_step)
    family = dflash_family(read_drafter_config(path)) if path else None
    classes = {"dflash": DFlashDrafter, "dspark": DSparkDrafter, "muse-glimmer": MuseGlimmerDrafter}
    if family not in classes:
        raise MlxcelError(f"{path} is not a DFlash, DSpark or Muse Glimmer assistant drafter checkpoint "
                          "(its config.json names none of their structures)")
    vocab = target_vocab_size if target is None else target.vocab_size
    extra = {} if target is None else {"eos_token_ids": target.eos_token_ids, "tokenizer": target.tokenizer}
    return classes[family].load(path, target_vocab_size=vocab, **extra)


def _materialize(drafter: ModelDrafter) -> None:
    """Evaluate every array the bound drafter holds, on the loading thread: MLX records each lazy
    array against the creating thread's stream, and the engine thread cannot evaluate a graph
    recorded on another thread."""
    seen: set[int] = set()
    arrays: list = []

    def walk(obj, depth=0):
        if depth > 4 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, mx.array):
            arrays.append(obj)
        elif isinstance(obj, nn.Module):
            arrays.extend(v for _, v in tree_flatten(obj.parameters()))
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
