"""Rotary embedding of a one-token decode step as one compiled kernel (CPU only).

MLX's CPU backend has no native ``fast.rope``: it runs the fallback graph (about fifteen small
ops: frequencies, cos, sin, slices, products, a concatenation), ~90 us per call on a 2-core
x86-64 box, twice per layer, 5 ms of a SmolLM2 decode step. Compiled with ``mx.compile`` the same
graph is fused into a few kernels, ~40 us per call, with bitwise-identical output (checked for
every offset in ``tests/engine/platform/test_decode_speed_paths.py``).

Only one-token calls take the compiled path (a decode step's shape never changes, so it is traced
once per head count); prefill chunks and verify blocks keep ``mx.fast.rope``. The offset goes in
as an array, so a new position does not retrace. Plain ``nn.RoPE`` layers are swapped; scaled
variants (Llama 3, YaRN, SuScaled) are left as they are. Metal and CUDA have native rope kernels,
so nothing is swapped there (``engine/platform/device.py`` decides).
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn


@lru_cache(maxsize=None)
def _compiled(dims: int, traditional: bool, base: float, scale: float):
    def rope(x, offset):
        return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=offset)

    return mx.compile(rope)


class DecodeStepRoPE(nn.Module):
    """``nn.RoPE`` with its one-token calls compiled."""

    def __init__(self, rope: nn.RoPE):
        super().__init__()
        self.dims, self.traditional, self.base, self.scale = rope.dims, rope.traditional, rope.base, rope.scale

    def _extra_repr(self) -> str:
        return f"{self.dims}, traditional={self.traditional}, compiled one-token path"

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if x.ndim >= 2 and x.shape[-2] == 1:
            if not isinstance(offset, mx.array):
                offset = mx.array(offset, dtype=mx.int32)
            return _compiled(self.dims, self.traditional, self.base, self.scale)(x, offset)
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale,
                            offset=offset)


def compile_decode_rope(model: nn.Module) -> int:
    """Swap every plain ``nn.RoPE`` child of ``model`` for :class:`DecodeStepRoPE`; the count."""
    swapped = 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if type(child) is nn.RoPE:
                setattr(module, name, DecodeStepRoPE(child))
                swapped += 1
    return swapped
