"""``nn.Module`` stand-ins for ``nn.Linear`` / ``nn.Embedding`` (and MLX's quantized ones) whose
weight is a packed quantized matrix run by the CPU kernels (``qmatmul.py``).

They keep the interface mlx-lm's models call: a linear layer is ``layer(x)``, an embedding is
``embed(ids)`` and, for tied heads, ``embed.as_linear(x)``. The packed bytes are the module's
``packed`` parameter, so ``load_weights`` and ``parameters()`` see them like any weight.
"""

from __future__ import annotations

import weakref

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.qmatmul import PackedWeight


def product(x: mx.array, w: PackedWeight) -> mx.array:
    """``x @ W.T`` on the kernels, at any width: prefill chunks too (dequantizing for OpenBLAS's
    sgemm from 64 rows was slower, 96-110 against 140-144 tok/s on a SmolLM2 prefill;
    docs/benchmarks-history.md)."""
    return qmatmul.qmatmul(x, w)


class SharedInput:
    """Projections of a layer that read the same input (q/k/v, gate/up): the first member called
    with an ``x`` computes every member's product in one ``qmatmul_multi`` (``x`` quantized once,
    one primitive instead of one per projection) and keeps the others' outputs for their calls
    with that same array object; each is bitwise what the member's own product gives, so callers
    that call the projections one by one (mlx-lm's attention and MLP, ``engine/cache/ragged.py``)
    need no change. A member called with another array, or again with the same one, computes
    afresh; the kept outputs are dropped once every member has taken its own.

    This runs 2 times per layer per step, so it is kept short: the member's place in the group
    is stored on the member, and the product's argument lists are built once and rebuilt only
    when a member's ``packed`` array is replaced (``load_weights``)."""

    def __init__(self, members: list[PackedLinear]):
        self._members = [weakref.ref(m) for m in members]  # no cycle: a dropped model frees by refcount
        self._x = None
        self._outs: dict[int, mx.array] = {}
        self._args: tuple | None = None  # (packed arrays, qtypes, groups, ns, k)

    def _multi_args(self) -> tuple:
        packed = [ref()["packed"] for ref in self._members]
        args = self._args
        if args is None or any(a is not b for a, b in zip(packed, args[0])):
            specs = [ref()._spec for ref in self._members]  # (qtype, group, n, k)
            args = self._args = (packed, [s[0] for s in specs], [s[1] for s in specs], [s[2] for s in specs],
                                 specs[0][3])
        return args

    def product(self, member: PackedLinear, x: mx.array) -> mx.array:
        i = member._shared_index
        outs = self._outs
        if self._x is x and i in outs:
            y = outs.pop(i)
            if not outs:
                self._x = None
            return y
        ys = qmatmul.qmatmul_multi_args(x, *self._multi_args())
        self._x, self._outs = x, {j: y for j, y in enumerate(ys) if j != i}
        return ys[i]


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
            for j, m in enumerate(members):
                m._shared = group
                m._shared_index = j
            groups += 1
    return groups


class _PackedModule(nn.Module):
    """What a packed linear and a packed embedding share: the ``packed`` array and its spec, the
    ``PackedWeight`` made from them, and, for a module packed from float weights
    (``pack_float_modules``), a ``weight`` to read and to set as a plain layer has."""

    _weight: PackedWeight | None = None  # weight_spec's last answer

    def __init__(self, w: PackedWeight):
        super().__init__()
        self.packed = w.packed
        self._spec = (w.qtype, w.group, w.n, w.k)

    def __setattr__(self, key, val):
        if key == "weight" and isinstance(val, mx.array):  # a model or a test editing a matrix
            w = qmatmul.pack_float(val)  # after loading: re-laid in its place
            self.packed = w.packed
            self._spec = (w.qtype, w.group, w.n, w.k)
        else:
            super().__setattr__(key, val)

    @property
    def weight_spec(self) -> PackedWeight:
        """The module's ``PackedWeight``, made once and again only when its ``packed`` array has
        been replaced (``load_weights``); every projection call asks for it."""
        packed = self["packed"]
        w = self._weight
        if w is None or w.packed is not packed:
            qtype, group, n, k = self._spec
            w = self._weight = PackedWeight(packed, qtype, n, k, group)
        return w

    @property
    def weight(self) -> mx.array:
        """The ``[n, k]`` float32 matrix of a module packed from float weights, for the few callers
        that read ``.weight`` rather than calling the layer (a reranker's rows, a drafter sharing
        the target's embedding table); a copy made on each access. Quantized packed modules have
        no ``weight``."""
        if self._spec[0] != qmatmul.F32:
            raise AttributeError(f"{type(self).__name__} of packed type {self._spec[0]} has no float weight")
        return qmatmul.dequantize(self.weight_spec)


class PackedLinear(_PackedModule):
    _shared: SharedInput | None = None  # set by share_inputs
    _shared_index = 0

    def __init__(self, w: PackedWeight, bias: bool = False):
        super().__init__(w)
        if bias:
            self.bias = mx.zeros((w.n,))

    def _extra_repr(self) -> str:
        qtype, group, n, k = self._spec
        return f"input_dims={k}, output_dims={n}, packed type {qtype}" + (f", group {group}" if group else "")

    def __call__(self, x: mx.array) -> mx.array:
        y = product(x, self.weight_spec) if self._shared is None else self._shared.product(self, x)
        if "bias" in self:
            y = y + self.bias
        return y


class PackedEmbedding(_PackedModule):
    def _extra_repr(self) -> str:
        qtype, _, n, k = self._spec
        return f"{n}, {k}, packed type {qtype}"

    def __call__(self, ids: mx.array) -> mx.array:
        return qmatmul.dequant_rows(ids, self.weight_spec)

    def as_linear(self, x: mx.array) -> mx.array:
        return product(x, self.weight_spec)


def _stand_in(child: nn.Module, w: PackedWeight, embedding: bool) -> nn.Module:
    """The packed module taking ``child``'s place: an embedding, or a linear layer keeping its bias."""
    if embedding:
        return PackedEmbedding(w)
    linear = PackedLinear(w, bias="bias" in child)
    if "bias" in child:
        linear.bias = child.bias
    return linear


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
            setattr(module, name, _stand_in(child, w, isinstance(child, nn.QuantizedEmbedding)))
            packed += 1
    return packed, left


def pack_float_modules(model: nn.Module) -> int:
    """Replace every plain ``nn.Linear`` / ``nn.Embedding`` of ``model`` whose weight is float (2-D)
    with its packed stand-in over float32 tiles (``qmatmul.pack_float``), so float models run the
    same kernel family as quantized ones: one pass over the weights for 1..16 rows, a row's bits
    independent of the call's width. Subclasses (sharded, LoRA, quantized layers) are left alone.
    Returns the number of modules packed."""
    packed = 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if type(child) not in (nn.Linear, nn.Embedding):
                continue
            weight = child.weight
            # matrices of the quantized kernels' shapes only (as packable GGUF tensors: inputs a
            # multiple of 32); the few small ones (gemma3n's AltUp coefficients, which the model
            # rewrites in place each call) stay MLX's
            if weight.ndim != 2 or not mx.issubdtype(weight.dtype, mx.floating) or weight.shape[1] % 32 \
                    or weight.shape[0] < 16:
                continue
            setattr(module, name, _stand_in(child, qmatmul.pack_float(weight), type(child) is nn.Embedding))
            packed += 1
    return packed


def unpack_float_modules(model: nn.Module) -> int:
    """The inverse of :func:`pack_float_modules`: each module packed from float weights back to a
    plain ``nn.Linear`` / ``nn.Embedding`` holding its float32 matrix (a copy of a target's layer
    that is to load other weights by name, as an MTP drafter's decoder layer). The count."""
    count = 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if not isinstance(child, (PackedLinear, PackedEmbedding)) or child._spec[0] != qmatmul.F32:
                continue
            _, _, n, k = child._spec
            if isinstance(child, PackedEmbedding):
                plain = nn.Embedding(n, k)
            else:
                plain = nn.Linear(k, n, bias="bias" in child)
                if "bias" in child:
                    plain.bias = child.bias
            plain.weight = child.weight
            setattr(module, name, plain)
            count += 1
    return count


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
