"""A decoder layer's small ops as single CPU primitives, for models running on the CPU kernels.

After the matmuls moved to the quantized kernels (``qmatmul.py``), what remained of a SmolLM2
decode step was MLX's fixed per-primitive cost: ~2,600 primitives per step, ~87 per layer, most
of them the pieces MLX's CPU backend builds RMS norm (square, sum, rsqrt, multiplies), rotary
embedding (its fallback graph: arange, cos, sin, slices, products, a concatenation) and attention
(matmuls, softmax, transposes) from. The extension computes each as one primitive
(``qmatmul_src/fused.cpp``); this module swaps them in:

* ``nn.RMSNorm`` -> :class:`FusedRMSNorm`;
* plain ``nn.RoPE`` -> :class:`FusedRoPE` for integer offsets (a batch cache's per-row offsets
  keep MLX's rope);
* the model module's ``scaled_dot_product_attention`` -> one that takes the fused attention for
  no mask or a causal one (a mask array, attention sinks or a quantized cache keep mlx-lm's);
  mlx-lm's model code calls it by module-level name, so this one is patched per architecture
  (``restore_attention`` undoes it);
* the model module's ``swiglu`` (``silu(gate) * up``, an ``mx.compile`` of MLX's element-wise ops,
  whose CPU code evaluates ``exp`` one lane at a time) -> one vectorized primitive, patched the
  same way;
* a float ``nn.Linear`` with fewer than 16 outputs (the ones ``packed_modules.pack_float_modules``
  leaves to MLX: Qwen3-Next's shared-expert gate, 1 output; small routers) -> :class:`RowwiseLinear`.
  MLX's CPU matmul hands it to OpenBLAS, whose narrow-output paths (1 to 3 columns: a
  matrix-vector product over the rows) round a row differently with the number of rows: a
  5-token verify forward and a 2-token forward of the same tokens then disagree in the last bits
  (tests/engine/platform/test_fused_layers.py).

Each computes a row (token) with the same code whatever the number of rows, as the matmul
kernel does, so a block forward gives the same bits as one-token forwards and the exactness
probe can allow block verification. CPU only, and only for models whose weights are packed
(``device.prepare_for_decode``); ``MLXCEL_FUSED_OPS=0`` turns it off.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.platform import qmatmul


class FusedRMSNorm(nn.Module):
    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.weight = norm.weight
        self.eps = float(norm.eps)

    def _extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, fused"

    def __call__(self, x: mx.array) -> mx.array:
        return qmatmul.extension().rms_norm(x, self.weight, self.eps)


class FusedRoPE(nn.Module):
    def __init__(self, rope: nn.RoPE):
        super().__init__()
        self.dims, self.traditional, self.base, self.scale = rope.dims, rope.traditional, rope.base, rope.scale

    def _extra_repr(self) -> str:
        return f"{self.dims}, traditional={self.traditional}, fused"

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if isinstance(offset, int) and x.ndim == 4:
            return qmatmul.extension().rope(x, self.dims, self.traditional, float(self.base), float(self.scale), offset)
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale,
                            offset=offset)


# Output widths below this stay on MLX's matmul after packing (``pack_float_modules``).
NARROW_OUTPUTS = 16


class RowwiseLinear(nn.Module):
    """``x @ weight.T (+ bias)`` for a handful of outputs as a broadcast product and a last-axis sum:
    each output is one contiguous reduction of one row, by the same code whatever the number of
    rows (a matmul of this shape goes to OpenBLAS, which is not: module docstring)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        if "bias" in linear:
            self.bias = linear.bias

    def _extra_repr(self) -> str:
        return f"input_dims={self.weight.shape[1]}, output_dims={self.weight.shape[0]}, rowwise"

    def __call__(self, x: mx.array) -> mx.array:
        y = (mx.expand_dims(x, -2) * self.weight).sum(axis=-1)
        return y + self.bias if "bias" in self else y


def _narrow_float(child) -> bool:
    w = getattr(child, "weight", None)
    return type(child) is nn.Linear and w is not None and w.ndim == 2 and w.dtype == mx.float32 \
        and w.shape[0] < NARROW_OUTPUTS


_originals: dict[tuple[str, str], object] = {}


def _fused_sdpa(original):
    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        if sinks is None and not hasattr(cache, "bits") and (mask is None or isinstance(mask, str) and
                                                              mask == "causal") and queries.ndim == 4 \
                and queries.shape[-1] == keys.shape[-1] == values.shape[-1]:  # not MLA's wider q/k
            return qmatmul.extension().attention(queries, keys, values, float(scale), mask == "causal")
        return original(queries, keys, values, cache, scale, mask, sinks)

    sdpa.mlxcel_fused = True
    return sdpa


def _fused_swiglu(original):
    def swiglu(gate, x):
        if gate.shape == x.shape and gate.dtype == x.dtype == mx.float32:
            return qmatmul.extension().swiglu(gate, x)
        return original(gate, x)

    swiglu.mlxcel_fused = True
    return swiglu


def _patch(mod, name: str, wrap) -> bool:
    fn = getattr(mod, name, None)
    if fn is None or getattr(fn, "mlxcel_fused", False):
        return False
    _originals[(mod.__name__, name)] = fn
    setattr(mod, name, wrap(fn))
    return True


def fuse_layers(model: nn.Module) -> dict[str, int]:
    """Swap the norms, ropes, attention, SwiGLU and narrow float linears of ``model`` (an mlx-lm
    model); counts of each."""
    counts = {"rms_norm": 0, "rope": 0, "attention": 0, "swiglu": 0, "rowwise_linear": 0}
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if type(child) is nn.RMSNorm:
                setattr(module, name, FusedRMSNorm(child))
                counts["rms_norm"] += 1
            elif type(child) is nn.RoPE:
                setattr(module, name, FusedRoPE(child))
                counts["rope"] += 1
            elif _narrow_float(child):
                setattr(module, name, RowwiseLinear(child))
                counts["rowwise_linear"] += 1
    # mlx-lm's model modules import scaled_dot_product_attention (models.base) and swiglu
    # (models.activations) by name.
    for cls in {type(m) for _, m in model.named_modules()}:
        mod = sys.modules.get(cls.__module__)
        if mod is None or not mod.__name__.startswith("mlx_lm.models."):
            continue
        counts["attention"] += _patch(mod, "scaled_dot_product_attention", _fused_sdpa)
        counts["swiglu"] += _patch(mod, "swiglu", _fused_swiglu)
    return counts


def restore_attention() -> None:
    """Put mlx-lm's attention and SwiGLU back in every model module patched so far. The patch is
    per model module (architecture), not per model: a float model of the same architecture in the
    same process also gets the fused ops (same results within float rounding)."""
    for (name, attr), fn in _originals.items():
        setattr(sys.modules[name], attr, fn)
    _originals.clear()
