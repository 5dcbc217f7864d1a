"""``nn.Module`` stand-ins for ``nn.Linear`` / ``nn.Embedding`` (and MLX's quantized ones) whose
weight is a packed quantized matrix run by the CPU kernels (``qmatmul.py``).

They keep the interface mlx-lm's models call: a linear layer is ``layer(x)``, an embedding is
``embed(ids)`` and, for tied heads, ``embed.as_linear(x)``. The packed bytes are the module's
``packed`` parameter, so ``load_weights`` and ``parameters()`` see them like any weight.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.qmatmul import PackedWeight

# The other path for wide products (prefill chunks): dequantize the matrix and use MLX's float32
# matmul (OpenBLAS sgemm) for calls of at least this many rows. Measured on SmolLM2 (256-token
# prefill, one thread, docs/benchmarks.md): the kernel 140-144 tok/s, dequantize + sgemm from 64
# rows 96-110, float32 weights 81; so it is off (0) by default, kept as a switch for CPUs where
# sgemm is relatively faster. Verify blocks stay on the kernel either way when under it.
WIDE_ROWS = int(os.environ.get("MLXCEL_WIDE_ROWS", "0"))


def product(x: mx.array, w: PackedWeight) -> mx.array:
    rows = x.size // max(1, x.shape[-1])
    if WIDE_ROWS and rows >= WIDE_ROWS:
        return x @ qmatmul.dequantize(w).astype(x.dtype).T
    return qmatmul.qmatmul(x, w)


class PackedLinear(nn.Module):
    def __init__(self, w: PackedWeight, bias: bool = False):
        super().__init__()
        self.packed = w.packed
        self._spec = (w.qtype, w.group, w.n, w.k)
        if bias:
            self.bias = mx.zeros((w.n,))

    @property
    def weight_spec(self) -> PackedWeight:
        qtype, group, n, k = self._spec
        return PackedWeight(self.packed, qtype, n, k, group)

    def _extra_repr(self) -> str:
        qtype, group, n, k = self._spec
        return f"input_dims={k}, output_dims={n}, packed type {qtype}" + (f", group {group}" if group else "")

    def __call__(self, x: mx.array) -> mx.array:
        y = product(x, self.weight_spec)
        if "bias" in self:
            y = y + self.bias
        return y


class PackedEmbedding(nn.Module):
    def __init__(self, w: PackedWeight):
        super().__init__()
        self.packed = w.packed
        self._spec = (w.qtype, w.group, w.n, w.k)

    @property
    def weight_spec(self) -> PackedWeight:
        qtype, group, n, k = self._spec
        return PackedWeight(self.packed, qtype, n, k, group)

    def _extra_repr(self) -> str:
        qtype, _, n, k = self._spec
        return f"{n}, {k}, packed type {qtype}"

    def __call__(self, ids: mx.array) -> mx.array:
        return qmatmul.dequant_rows(ids, self.weight_spec)

    def as_linear(self, x: mx.array) -> mx.array:
        return product(x, self.weight_spec)


def pack_affine_modules(model: nn.Module) -> tuple[int, int]:
    """Replace every 4- or 8-bit affine ``QuantizedLinear`` / ``QuantizedEmbedding`` of ``model``
    (groups of 32, 64 or 128) with its packed stand-in. Returns (packed, left as they were)."""
    packed = left = 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if not isinstance(child, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
                continue
            if getattr(child, "mode", "affine") != "affine" or child.bits not in (4, 8) \
                    or child.group_size not in (32, 64, 128):
                left += 1
                continue
            w = qmatmul.pack_affine(child.weight, child.scales, child.biases, child.bits, child.group_size)
            if isinstance(child, nn.QuantizedEmbedding):
                replacement = PackedEmbedding(w)
            else:
                replacement = PackedLinear(w, bias="bias" in child)
                if "bias" in child:
                    replacement.bias = child.bias
            setattr(module, name, replacement)
            packed += 1
    return packed, left


def install_packed(model: nn.Module, weights: dict[str, PackedWeight]) -> None:
    """Swap the ``nn.Linear`` / ``nn.Embedding`` at each module path (``model.layers.0.mlp.up_proj``)
    for its packed stand-in holding ``weights[path]`` (a linear layer's bias stays a parameter)."""
    for path, w in weights.items():
        *parents, leaf = path.split(".")
        owner = model
        for part in parents:
            owner = owner[int(part)] if isinstance(owner, list) else getattr(owner, part)
        old = getattr(owner, leaf)
        if isinstance(old, nn.Embedding):
            new = PackedEmbedding(w)
        elif isinstance(old, nn.Linear):
            new = PackedLinear(w, bias="bias" in old)
        else:
            raise ValueError(f"{path} is a {type(old).__name__}, not a linear or embedding layer")
        setattr(owner, leaf, new)
