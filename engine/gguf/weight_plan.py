"""For every parameter of the mlx-lm model a GGUF file describes, the tensor(s) it is made from.

The parameter list comes from the mlx-lm class itself (built lazily, so nothing is computed), so
a file is checked both ways before any weight is converted: every parameter must have a
tensor, and every tensor must be used or known to be carried otherwise (``is_ignored``).
"""

from __future__ import annotations

import importlib

import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.architectures import Architecture, Conversion, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata


def model_class(config: dict) -> nn.Module:
    """An mlx-lm model for ``config`` with its initial (lazy, unevaluated) parameters."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    return module.Model(module.ModelArgs.from_dict(config))


def plan_weights(spec: Architecture, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> dict[str, Conversion]:
    params = dict(tree_flatten(model_class(config).parameters()))
    plan: dict[str, Conversion] = {}
    missing = []
    for name, initial in params.items():
        conv = spec.conversion(name, config, meta, tensors)
        if conv is None:
            if not spec.optional(name, config, tensors):
                missing.append(name)
            continue
        conv.shape = tuple(initial.shape)
        plan[name] = conv
    if missing:
        raise ModelLoadError(
            f"{meta.source}: architecture {meta.arch!r} needs {len(missing)} tensor(s) the file lacks for mlx-lm's "
            f"{config['model_type']} model: " + ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        )
    used = {source for conv in plan.values() for source in conv.sources}
    extra = sorted(n for n in tensors if n not in used and not spec.is_ignored(n, config))
    if extra:
        raise ModelLoadError(
            f"{meta.source}: unexpected tensor(s) for architecture {meta.arch!r} (mlx-lm's {config['model_type']} "
            f"has no place for them): " + ", ".join(extra[:6]) + (" ..." if len(extra) > 6 else "")
        )
    return plan
