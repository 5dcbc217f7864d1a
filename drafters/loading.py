"""Loading what a chosen drafter kind needs, once, into a :class:`DrafterSource` that makes one
fresh drafter per sequence, through the loader the kind declares (``registry.DrafterKind.load``):
a draft model checked against the target's vocabulary, nothing (prompt lookup), or a model-based
kind's network, which is bound to the target here, the same way for every such kind. Also
:func:`load_target`, the engine's model loader with drafter-only checkpoints refused
(``registry.refuse_as_model``), and :func:`load_model_drafter`, a bare network for tests and
benchmarks."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel.drafters.registry import (
    KINDS,
    Choice,
    DrafterKind,
    LookupOptions,
    checkpoint_kind,
    read_drafter_config,
    refuse_as_model,
)
from mlxcel.drafters.source import DrafterSource, SourceRequest
from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.speculative.drafter import ModelDrafter

log = logging.getLogger(__name__)


def load_target(model: str | Path | None = None, *, hf_repo: str | None = None,
                hf_file: str | None = None, shard: Callable[[nn.Module], None] | None = None,
                mmproj: str | None = None, mmproj_auto: bool = False) -> LoadedModel:
    """``engine.model.loading.load_model`` for a model that is to be served or verified against:
    a drafter-only checkpoint is refused with a message naming where it runs. A vision tower is
    loaded only when asked (``mmproj``, or ``mmproj_auto``: the server's; a draft model never needs one)."""
    return load_model(model, hf_repo=hf_repo, hf_file=hf_file, check_config=refuse_as_model, shard=shard,
                      mmproj=mmproj, mmproj_auto=mmproj_auto)


def load(choice: Choice, target: LoadedModel, *, lookup: LookupOptions = LookupOptions(),
         prefill_step: int = 512) -> DrafterSource:
    """Load what ``choice`` needs against ``target`` (at startup, so no request pays the disk load)."""
    start = time.perf_counter()
    kind = choice.kind
    loaded = kind.loader()(_request(kind, choice.draft_model, target, draft_hf=choice.draft_hf, lookup=lookup,
                                    prefill_step=prefill_step))
    expected = ModelDrafter if kind.model_based else DrafterSource
    if not isinstance(loaded, expected):
        raise TypeError(f"the {kind.name} kind's loader ({kind.load}) returned a {type(loaded).__name__}, not a "
                        f"{expected.__name__} (model_based={kind.model_based})")
    if not kind.model_based:
        return loaded
    return _bound_source(loaded, target, choice.draft_model or "the target's own MTP layers", start)


def _bound_source(drafter: ModelDrafter, target: LoadedModel, where: str, start: float) -> DrafterSource:
    """A model-based kind's network bound to ``target``: each sequence drafts with a shallow copy of it."""
    drafter.bind(target.model)
    _materialize(drafter)
    if drafter.feature_layers:
        where += f", reads target layers {list(drafter.feature_layers)}"
    return DrafterSource(lambda n_min, _: copy.copy(drafter), drafter.declared_block,
                         f"{drafter.kind} ({where}) in {time.perf_counter() - start:.2f} s", model_drafter=drafter)


def load_model_drafter(path: str | Path | None, kind: DrafterKind | None = None, target: LoadedModel | None = None,
                       *, target_vocab_size: int | None = None, prefill_step: int = 512) -> ModelDrafter:
    """The model-based drafter a checkpoint describes, loaded, not bound: the kind its config.json is by
    structure (on ``kind``'s round loop when one is named), else ``kind`` (the MTP kinds read the
    target's own layers without a checkpoint)."""
    structure = checkpoint_kind(read_drafter_config(path)) if path else None
    if structure is not None and (kind is None or structure.loop == kind.loop):
        kind = structure
    if kind is None or not kind.model_based:
        names = ", ".join(k.name for k in KINDS if k.model_based and k.structure is not None)
        raise MlxcelError(f"{path} is not a model-based drafter checkpoint (its config.json names the structure "
                          f"of none of {names})")
    return kind.loader()(_request(kind, path, target, target_vocab_size=target_vocab_size,
                                  prefill_step=prefill_step))


def _request(kind: DrafterKind, draft_model: str | Path | None, target: LoadedModel | None,
             **settings) -> SourceRequest:
    path = str(draft_model) if draft_model else None
    return SourceRequest(kind.drafter_class(), target, draft_model=path,
                         config=read_drafter_config(path) if path else {}, default_block=kind.default_block,
                         **settings)


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
