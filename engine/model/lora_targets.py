"""The layers of a loaded model an adapter may change, and the shape checks an adapter's factors must
pass against them.

A layer is adaptable when it is one of the linear kinds mlxcel builds (MLX's float or quantized
linear, the CPU kernels' packed linear, the fused ops' row-wise narrow linear), each of whose
``__call__(x)`` is ``x W^T (+ b)``. Other modules are refused by name: an embedding (mlxcel applies
adapters to linear layers only), a stack of experts, a tensor-parallel shard (whose output is summed
across ranks after the product). The checks are llama.cpp's (``src/llama-adapter.cpp``): the factors'
outer dimensions must be the layer's, and their inner ones agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn
import numpy as np

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.lora_linear import LoraLayer
from mlxcel.engine.platform.fused_layers import RowwiseLinear
from mlxcel.engine.platform.packed_modules import PackedLinear

ADAPTABLE = (nn.Linear, nn.QuantizedLinear, PackedLinear, RowwiseLinear)


@dataclass
class Target:
    """An adaptable layer at module path ``path``: ``out`` x ``inputs`` (its ``W``)."""

    path: str
    module: nn.Module
    out: int
    inputs: int


def own_type(module) -> type:
    """A layer's class before an adapter was installed on it."""
    cls = type(module)
    return cls.__mro__[2] if issubclass(cls, LoraLayer) else cls


def _dims(module) -> tuple[int, int]:
    cls = own_type(module)
    if cls is PackedLinear:
        _, _, n, k = module._spec
        return int(n), int(k)
    out, inputs = (int(d) for d in module.weight.shape)
    if cls is nn.QuantizedLinear:
        inputs = inputs * 32 // module.bits
    return out, inputs


def targets(model: nn.Module) -> dict[str, Target]:
    """Every adaptable layer of ``model`` by module path (``model.layers.0.self_attn.q_proj``)."""
    found = {}
    for path, module in model.named_modules():
        if own_type(module) in ADAPTABLE:
            out, inputs = _dims(module)
            found[path] = Target(path, module, out, inputs)
    return found


def module_kinds(model: nn.Module) -> dict[str, str]:
    """Every module path of ``model`` and its class name: what a refusal names when an adapter
    targets a module that exists but cannot be adapted."""
    return {path: own_type(module).__name__ for path, module in model.named_modules() if path}


def refuse_kind(source: str, tensor: str, path: str, kind: str) -> ModelLoadError:
    return ModelLoadError(f"{source}: LoRA tensor {tensor!r} adapts {path} (a {kind}); mlxcel applies adapters "
                          "to linear layers only (not to embeddings, expert stacks or sharded layers)")


def check_factors(source: str, tensor: str, target: Target, a: np.ndarray, b: np.ndarray) -> None:
    """``a`` ``[rank, in]`` and ``b`` ``[out, rank]`` must fit ``target``'s ``W`` ``[out, in]``."""
    if a.ndim != 2 or b.ndim != 2:
        raise ModelLoadError(f"{source}: LoRA tensor {tensor!r} has {max(a.ndim, b.ndim)} dimensions; mlxcel "
                             "applies adapters to plain linear layers only (not to expert stacks)")
    if a.shape[1] != target.inputs or b.shape[0] != target.out:
        raise ModelLoadError(f"{source}: tensor {tensor!r} has incorrect shape (hint: maybe wrong base model?): "
                             f"the adapter changes a {b.shape[0]} x {a.shape[1]} matrix, {target.path} is "
                             f"{target.out} x {target.inputs}")
    if a.shape[0] != b.shape[1]:
        raise ModelLoadError(f"{source}: {tensor!r}: lora_a tensor is not transposed (hint: adapter from "
                             f"\"finetune\" example is no longer supported): rank {a.shape[0]} against {b.shape[1]}")
