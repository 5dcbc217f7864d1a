"""The CPU extension's primitives for a forward over rows of different lengths laid out flat: each
token brings its own row and absolute position, and nothing is padded (``qmatmul_src/fused.cpp``).

* :func:`rope_positions`: ``x[n, h, d]`` with token ``i`` rotated at ``positions[i]``, by the fused
  rope's per-token code (``FusedRoPE`` gives the same bits for that token at that position);
* :func:`ragged_attention`: query ``i`` attends to keys ``0 .. positions[i]`` of its row's cache,
  exactly those, by the fused attention's per-query code. So a row's attention is the same bits
  whatever else is in the forward, however long the other rows are (MLX's masked attention over a
  padded view rounds by the padded shape), and the same as the single-sequence fused attention gives.

:func:`runs_fused` says whether a model runs the fused ops at all (a packed model on the CPU with
the extension built and ``MLXCEL_FUSED_OPS`` on, ``device.prepare_for_decode``): the callers keep
MLX's ops (Metal, CUDA, float weights) otherwise.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.fused_layers import FusedRoPE


def runs_fused(model) -> bool:
    """Whether ``model``'s attention layers run the fused CPU ops (their rope is a ``FusedRoPE``)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return bool(layers) and all(isinstance(getattr(getattr(layer, "self_attn", None), "rope", None), FusedRoPE)
                                for layer in layers)


def rope_positions(x: mx.array, positions: mx.array, rope: FusedRoPE) -> mx.array:
    """``x[n, h, d]`` rotated per token at ``positions`` (int32 ``[n]``) with ``rope``'s parameters."""
    return qmatmul.extension().rope_positions(x, positions, rope.dims, rope.traditional, float(rope.base),
                                              float(rope.scale))


def ragged_attention(q: mx.array, keys: mx.array, values: mx.array, rows: mx.array, positions: mx.array,
                     scale: float) -> mx.array:
    """``q[n, hq, d]``; ``keys``/``values`` ``[b, hkv, s, d]`` (any strides); query ``i`` sees keys
    ``0 .. positions[i]`` of row ``rows[i]``. The caller keeps ``rows < b`` and ``positions < s``
    (the kernel only clamps them to stay inside the arrays). Returns ``[n, hq, d]``."""
    return qmatmul.extension().ragged_attention(q, keys, values, rows, positions, float(scale))
