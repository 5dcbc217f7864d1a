"""A linear layer with LoRA adapters whose scales are chosen per token, so that one forward serves
rows that each run with their own adapter mix.

An adapted layer computes ``y = base(x) + sum_a s_a(token) * f_a * (x A_a^T) B_a^T``: ``A_a`` ``[r_a, in]``
and ``B_a`` ``[out, r_a]`` are adapter ``a``'s factors for this layer, ``f_a`` its fixed factor (a GGUF
adapter's ``alpha / rank``, an mlx-lm adapter's ``scale``), and ``s_a(token)`` the scale the token's row
asks for adapter ``a``. Every adapter of the layer is one stack (``A`` ``[R, in]``, ``B`` ``[out, R]``,
``R`` their ranks together), so a layer runs two small products whatever the adapters and scales:
``t = x A^T``, each column of ``t`` times its adapter's ``s_a f_a`` for that token, then ``t B^T``. An
adapter a row does not use contributes exact zeros.

The scales come from the forward, not from the layer: a backend (``engine.decode.step``, the ragged
batch) sets the forward's token scales with :func:`active_scales` while it builds the forward's graph,
as an array laid out like the forward's tokens (``[1, N, A]`` for the ragged batch's flat tokens,
``[B, 1, A]`` for a batch cache's rows, ``[A]`` when every token has the same) or None (no token uses an
adapter: the layer is its base exactly). Outside a forward that sets them (a drafter's own network, an
embedding) no adapter applies. The engine builds graphs on one thread, so the scales are module state.

Exactness: where float weights run on the CPU kernels' float32 tiles (``device.float_kernels``), the
factors are packed as tiles too (``qmatmul.pack_float``), whose product rounds a row the same at any
height; the per-token column scaling and the sum are elementwise. So a row's delta, like its base
product, does not depend on the other rows of the forward, and a row whose scales are all zero beside
adapted rows gets ``base + 0``: its base value exactly. Elsewhere the factors are MLX arrays and the
products MLX's matmul.

Why the layer's class is swapped rather than the layer wrapped: the module tree (parameter names, the
shared q/k/v products of ``packed_modules.share_inputs``, drafters that read a target's ``lm_head`` or
``weight``) stays as it was; ``type(layer)`` is no longer the plain class, so ``lean_blocks`` stops
planning (straight-through CPU kernels that never call a module) any block with an adapted layer, and
such a block runs its modules, adapters included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel.engine.platform import device, qmatmul
from mlxcel.engine.platform.qmatmul import PackedWeight


@dataclass
class Factors:
    """One adapter's factors for one layer: ``a`` ``[rank, in]``, ``b`` ``[out, rank]`` (float32), and
    ``factor``, what its scale is multiplied by (``alpha / rank`` or mlx-lm's ``scale``)."""

    adapter: int  # index in the adapter set
    a: np.ndarray
    b: np.ndarray
    factor: float


class _Forward:
    """The token scales of the forward being built, and the per-column scales the layers derived
    from them (one array per column layout, shared by the layers that have it)."""

    def __init__(self):
        self.scales: mx.array | None = None
        self.columns: dict[tuple, mx.array] = {}


_forward = _Forward()


@contextmanager
def active_scales(scales: mx.array | None) -> Iterator[None]:
    """Adapter scales for the forward built inside the block (module docstring for the layouts)."""
    saved = _forward.scales, _forward.columns
    _forward.scales, _forward.columns = scales, {}
    try:
        yield
    finally:
        _forward.scales, _forward.columns = saved


@contextmanager
def scales_at(index: mx.array) -> Iterator[None]:
    """The active per-token scales of a flat ``[1, N, A]`` forward narrowed to tokens ``index``: what
    the head of a forward that projects only some positions sees (uniform scales stay as they are)."""
    scales = _forward.scales
    if scales is None or scales.ndim == 1:
        yield
        return
    with active_scales(mx.take(scales, index, axis=-2)):
        yield


def _vector(row: Sequence[float], width: int) -> list[float]:
    return [float(s) for s in row] + [0.0] * (width - len(row))


def _width(rows: Sequence[Sequence[float]]) -> int:
    """Adapters in the rows' scales; 0 when no row uses any (every scale zero)."""
    if not any(any(s != 0 for s in row) for row in rows):
        return 0
    return max(len(row) for row in rows)


def row_scales(rows: Sequence[Sequence[float]]) -> mx.array | None:
    """Scales for a forward of one sequence per row (``[B, 1, A]``: mlx-lm's batch cache), or ``[A]``
    when every row has the same, or None when none uses an adapter."""
    width = _width(rows)
    if not width:
        return None
    vectors = [_vector(row, width) for row in rows]
    if all(v == vectors[0] for v in vectors):
        return mx.array(vectors[0], dtype=mx.float32)
    return mx.array(vectors, dtype=mx.float32)[:, None, :]


def flat_scales(rows: Sequence[Sequence[float]], counts: Sequence[int]) -> mx.array | None:
    """Scales for a forward whose tokens are the rows' tokens laid flat (``[1, N, A]``, row ``i``'s
    ``counts[i]`` tokens with its scales: the ragged batch), ``[A]`` when every row has the same, or
    None when none uses an adapter."""
    width = _width(rows)
    if not width:
        return None
    vectors = [_vector(row, width) for row in rows]
    if all(v == vectors[0] for v in vectors):
        return mx.array(vectors[0], dtype=mx.float32)
    table = np.repeat(np.asarray(vectors, dtype=np.float32), np.asarray(counts, dtype=np.int64), axis=0)
    return mx.array(table)[None]


def uniform_scales(row: Sequence[float]) -> mx.array | None:
    """One row's scales for every token of a forward (a sequence on its own cache)."""
    return row_scales([row])


class _Delta:
    """A layer's stacked factors (module docstring), ready to run."""

    def __init__(self, factors: list[Factors]):
        a = np.concatenate([f.a for f in factors], axis=0).astype(np.float32)
        b = np.concatenate([f.b for f in factors], axis=1).astype(np.float32)
        self.layout = tuple((f.adapter, f.a.shape[0], f.factor) for f in factors)
        columns = [f.adapter for f in factors for _ in range(f.a.shape[0])]
        self.columns = mx.array(columns, dtype=mx.int32)
        self.factors = mx.array([f.factor for f in factors for _ in range(f.a.shape[0])], dtype=mx.float32)
        self.tiles = device.float_kernels()
        if self.tiles:
            self.a: PackedWeight | mx.array = qmatmul.pack_float(mx.array(a))
            self.b: PackedWeight | mx.array = qmatmul.pack_float(mx.array(b))
        else:
            dtype = device.compute_dtype()
            self.a, self.b = mx.array(a).astype(dtype), mx.array(b).astype(dtype)
        self.adapters = {f.adapter for f in factors}

    def _product(self, x: mx.array, w) -> mx.array:
        return qmatmul.qmatmul(x, w) if self.tiles else x @ w.T

    def _column_scales(self, scales: mx.array) -> mx.array:
        cached = _forward.columns.get(self.layout)
        if cached is None:
            cached = mx.take(scales, self.columns, axis=-1) * self.factors
            _forward.columns[self.layout] = cached
        return cached

    def __call__(self, x: mx.array, scales: mx.array) -> mx.array:
        if scales.ndim > 1 and (scales.ndim != x.ndim or any(
                s not in (1, n) for s, n in zip(scales.shape[:-1], x.shape[:-1]))):
            raise ValueError(f"adapter scales laid out as {tuple(scales.shape)} do not fit an input of shape "
                             f"{tuple(x.shape)}")
        columns = self._column_scales(scales).astype(x.dtype)
        return self._product(self._product(x, self.a) * columns, self.b).astype(x.dtype)


class LoraLayer:
    """Mixed in ahead of an adapted layer's own class (module docstring); ``_lora`` is set by
    :func:`install`."""

    _lora: _Delta | None = None

    def __call__(self, x: mx.array) -> mx.array:
        y = super().__call__(x)
        scales, delta = _forward.scales, self._lora
        if scales is None or delta is None:
            return y
        return y + delta(x, scales)


_classes: dict[type, type] = {}


def _lora_class(cls: type) -> type:
    if cls not in _classes:
        _classes[cls] = type(f"Lora{cls.__name__}", (LoraLayer, cls), {"__module__": cls.__module__})
    return _classes[cls]


def install(layer, factors: list[Factors]) -> None:
    """Give ``layer`` (a linear module, its ``__call__(x)`` being ``x W^T (+ b)``) these adapters."""
    base = type(layer).__mro__[2] if isinstance(layer, LoraLayer) else type(layer)
    layer.__class__ = _lora_class(base)
    object.__setattr__(layer, "_lora", _Delta(factors))  # not a parameter: past nn.Module's __setattr__


def adapted(layer) -> bool:
    return isinstance(layer, LoraLayer) and layer._lora is not None
