"""A decoder block's forward as one short Python function, for llama-style blocks whose every
piece already runs as one CPU primitive (packed weights, ``fused_layers``, ``share_inputs``).

With the kernels and the fused ops in place, a SmolLM2 one-token step still spent ~2.4 ms of CPU
building its graph in Python (profiled: ~110 Python calls per layer: module ``__call__``s,
``nn.Module.__getattr__``, the shared-input bookkeeping, the fused ops' own checks) for ~24 MLX
ops per layer. :class:`LeanBlock` builds the same graph, op for op and in the same order (same
primitives, same inputs, so bitwise the same outputs), from attributes read once when the block
is swapped; whatever its fast path does not cover goes to mlx-lm's own ``__call__``, unchanged:
a cache other than a list of plain per-layer caches with an integer offset (the batch caches'
per-row offsets, a quantized cache), an attention mask array, no cache, or inputs that are not
float32.

Only the exact classes in ``_BLOCKS`` are swapped (their ``__call__``s are the same few lines),
and only when each piece is the packed / fused kind; the parameter tree is untouched (the
block's class changes to a subclass, nothing is renamed). ``device.prepare_for_decode`` swaps them
wherever the fused ops are on.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.fused_layers import FusedRMSNorm, FusedRoPE
from mlxcel.engine.platform.packed_modules import PackedLinear

_BLOCKS = {("mlx_lm.models.llama", "TransformerBlock"), ("mlx_lm.models.qwen2", "TransformerBlock")}
_lean_classes: dict[type, type] = {}


class BlockPlan(NamedTuple):
    """What a swapped block's forward reads, taken from its modules once (:func:`lean_blocks`)."""

    ext: Any  # the extension module
    norm1: mx.array
    eps1: float
    qkv: tuple  # qmatmul_multi's arguments after x
    qkv_bias: tuple | None
    n_heads: int
    n_kv_heads: int
    rope: tuple  # dims, traditional, base, scale
    scale: float
    o: tuple  # qmatmul's arguments after x
    o_bias: mx.array | None
    norm2: mx.array
    eps2: float
    gate_up: tuple
    down: tuple
    down_bias: mx.array | None


def _bias(module: PackedLinear):
    return module["bias"] if "bias" in module else None


class LeanBlock:
    """Mixed in ahead of the mlx-lm block class; ``_plan`` is set by :func:`lean_blocks`."""

    _plan: BlockPlan | None = None

    def __call__(self, x, mask=None, cache=None):
        plan = self._plan
        if (plan is None or cache is None or not isinstance(cache.offset, int) or hasattr(cache, "bits")
                or not (mask is None or isinstance(mask, str) and mask == "causal") or x.dtype != mx.float32
                or x.ndim != 3):
            return super().__call__(x, mask, cache)
        ext, rope = plan.ext, plan.rope
        B, L, _ = x.shape
        # attention (mlx-lm's Attention.__call__ with the fused ops)
        q, k, v = qkv_products(plan, x)
        q = q.reshape(B, L, plan.n_heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(B, L, plan.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(B, L, plan.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = cache.offset
        q = ext.rope(q, *rope, offset)
        k = ext.rope(k, *rope, offset)
        k, v = cache.update_and_fetch(k, v)
        a = ext.attention(q, k, v, plan.scale, mask is not None)
        return output_and_mlp(plan, x, a.transpose(0, 2, 1, 3).reshape(B, L, -1))


def qkv_products(plan: BlockPlan, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """A planned block's input norm and q/k/v products (with their biases): the block's first ops,
    shared by :class:`LeanBlock` and the ragged forward (``engine/cache/ragged.py``)."""
    ext, bias = plan.ext, plan.qkv_bias
    q, k, v = ext.qmatmul_multi(ext.rms_norm(x, plan.norm1, plan.eps1), *plan.qkv)
    if bias is not None:
        q, k, v = q + bias[0], k + bias[1], v + bias[2]
    return q, k, v


def output_and_mlp(plan: BlockPlan, x: mx.array, a: mx.array) -> mx.array:
    """A planned block's ops after attention: ``a`` (the heads' outputs, tokens by features)
    through o, the residual, the MLP and its residual."""
    ext = plan.ext
    r = ext.qmatmul(a, *plan.o)
    if plan.o_bias is not None:
        r = r + plan.o_bias
    h = x + r
    g, u = ext.qmatmul_multi(ext.rms_norm(h, plan.norm2, plan.eps2), *plan.gate_up)
    r = ext.qmatmul(ext.swiglu(g, u), *plan.down)
    if plan.down_bias is not None:
        r = r + plan.down_bias
    return h + r


def _plan(block) -> BlockPlan | None:
    attn, mlp = block.self_attn, block.mlp
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    gate_up = [mlp.gate_proj, mlp.up_proj]
    mod = sys.modules[type(block).__module__]
    if not (all(type(m) is PackedLinear for m in (*qkv, *gate_up, attn.o_proj, mlp.down_proj))
            and isinstance(block.input_layernorm, FusedRMSNorm)
            and isinstance(block.post_attention_layernorm, FusedRMSNorm) and isinstance(attn.rope, FusedRoPE)
            and getattr(getattr(mod, "scaled_dot_product_attention", None), "mlxcel_fused", False)
            and getattr(getattr(mod, "swiglu", None), "mlxcel_fused", False)):
        return None
    for group in (qkv, gate_up):  # joined by share_inputs, in this order
        if group[0]._shared is None or any(m._shared is not group[0]._shared or m._shared_index != j
                                           for j, m in enumerate(group)):
            return None
    # (type(m) is, not isinstance: a sharded linear adds an all_sum to its product)
    if any(_bias(m) is not None for m in gate_up):
        return None
    biases = [_bias(m) for m in qkv]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        return None
    o, down = attn.o_proj.weight_spec, mlp.down_proj.weight_spec
    rope = attn.rope
    return BlockPlan(qmatmul.extension(), block.input_layernorm.weight, block.input_layernorm.eps,
            qkv[0]._shared._multi_args(), None if biases[0] is None else tuple(biases),
            attn.n_heads, attn.n_kv_heads, (rope.dims, rope.traditional, float(rope.base), float(rope.scale)),
            float(attn.scale), (o.packed, o.qtype, o.group, o.n, o.k), _bias(attn.o_proj),
            block.post_attention_layernorm.weight, block.post_attention_layernorm.eps,
            gate_up[0]._shared._multi_args(), (down.packed, down.qtype, down.group, down.n, down.k),
            _bias(mlp.down_proj))


def _lean_class(cls: type) -> type:
    if cls not in _lean_classes:
        _lean_classes[cls] = type(f"Lean{cls.__name__}", (LeanBlock, cls), {"__module__": cls.__module__})
    return _lean_classes[cls]


def lean_blocks(model: nn.Module) -> int:
    """Swap each eligible block of ``model`` (after ``fuse_layers`` and ``share_inputs``) to its
    lean subclass; the count. The plan holds the weights as they are now: a later
    ``load_weights`` must call this again or the block keeps the old arrays."""
    swapped = 0
    for _, module in model.named_modules():
        cls = type(module)
        base = cls.__mro__[2] if issubclass(cls, LeanBlock) else cls
        if (base.__module__, base.__name__) not in _BLOCKS:
            continue
        plan = _plan(module)
        if plan is None:
            if isinstance(module, LeanBlock):
                object.__setattr__(module, "_plan", None)
            continue
        module.__class__ = _lean_class(base)
        object.__setattr__(module, "_plan", plan)  # not a parameter: past nn.Module's __setattr__
        swapped += 1
    return swapped
