"""``nn.Module`` stand-ins for ``nn.Linear`` / ``nn.Embedding`` (and MLX's quantized ones) whose
weight is a packed quantized matrix run by the CPU kernels (``qmatmul.py``).

They keep the interface mlx-lm's models call: a linear layer is ``layer(x)``, an embedding is
``embed(ids)`` and, for tied heads, ``embed.as_linear(x)``. The packed bytes are the module's
``packed`` parameter, so ``load_weights`` and ``parameters()`` see them like any weight.
"""

from __future__ import annotations

import os
import weakref

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


class SharedInput:
    """Projections of a layer that read the same input (q/k/v, gate/up): the first member called
    with an ``x`` computes every member's product in one ``qmatmul_multi`` (``x`` quantized once,
    one primitive instead of one per projection) and keeps the others' outputs for their calls
    with that same array object; each is bitwise what the member's own product gives, so callers
    that call the projections one by one (mlx-lm's attention and MLP, ``engine/decode/ragged.py``)
    need no change. A member called with another array, or again with the same one, computes
    afresh; the kept outputs are dropped once every member has taken its own."""

    def __init__(self, members: list[PackedLinear]):
        self._members = [weakref.ref(m) for m in members]  # no cycle: a dropped model frees by refcount
        self._x = None
        self._outs: dict[int, mx.array] = {}

    def product(self, member: PackedLinear, x: mx.array) -> mx.array:
        members = [ref() for ref in self._members]
        i = next(j for j, m in enumerate(members) if m is member)
        if self._x is x and i in self._outs:
            y = self._outs.pop(i)
            if not self._outs:
                self._x = None
            return y
        rows = x.size // max(1, x.shape[-1])
        if WIDE_ROWS and rows >= WIDE_ROWS:
            return product(x, member.weight_spec)
        outs = qmatmul.qmatmul_multi(x, [m.weight_spec for m in members])
        self._x, self._outs = x, {j: y for j, y in enumerate(outs) if j != i}
        return outs[i]


# Children of one module that mlx-lm's models call on the same input, by name.
SHARED_INPUT_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def share_inputs(model: nn.Module) -> int:
    """Join each module's q/k/v and gate/up ``PackedLinear`` children (same ``k``) into a
    :class:`SharedInput`. Returns the number of groups made (0 with an extension without
    ``qmatmul_multi``)."""
    if not qmatmul.has_multi():
        return 0
    groups = 0
    for _, module in model.named_modules():
        children = module.children()
        for names in SHARED_INPUT_NAMES:
            members = [children.get(name) for name in names]
            if not all(isinstance(m, PackedLinear) and m._shared is None for m in members):
                continue
            if len({m._spec[3] for m in members}) != 1:
                continue
            group = SharedInput(members)
            for m in members:
                m._shared = group
            groups += 1
    return groups


class PackedLinear(nn.Module):
    _shared: SharedInput | None = None  # set by share_inputs

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
        y = product(x, self.weight_spec) if self._shared is None else self._shared.product(self, x)
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
