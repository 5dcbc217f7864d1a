"""A loaded model cut into this rank's shard, with mlx-lm's own sharding code.

Two ways, as llama.cpp's ``--split-mode`` names them:

* ``row`` (tensor parallel): the model's ``shard(group)`` (mlx-lm's llama, qwen2, qwen3, the
  DeepSeek and other MoE families): every attention and MLP projection is split with MLX's
  ``shard_linear`` (``all-to-sharded`` for q/k/v/gate/up, ``sharded-to-all`` for o/down, which
  ends in an ``all_sum``), so each rank keeps 1/N of every layer's matrices and of the KV cache.
* ``layer`` (pipeline parallel): the inner model's ``pipeline(group, split)`` (mlx-lm's
  ``PipelineMixin``: qwen2, qwen3-MoE, DeepSeek, ...): each rank keeps a run of layers;
  ``--tensor-split`` gives the proportions.

``shard_linear`` knows MLX's ``Linear`` and ``QuantizedLinear`` only, not the packed layers of
mlxcel's CPU kernels (``platform.packed_modules``). So a distributed rank loads with MLX's own
modules (the loader is told so with ``MLXCEL_WEIGHTS=quantized`` before it runs, see
``unpacked_loading``), mlx-lm shards those, and on a CPU with the kernels the sharded quantized
layers are then packed (:func:`pack_sharded`): a row-split layer is an ordinary packed linear over
its rows, a column-split one a packed linear followed by the same ``all_sum`` MLX's layer does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import QuantizedAllToShardedLinear, QuantizedShardedToAllLinear

from mlxcel.engine.distributed.world import DistributedError
from mlxcel.engine.platform import device, qmatmul
from mlxcel.engine.platform.packed_modules import PackedLinear, product
from mlxcel.engine.platform.settings import set_switches, settings

log = logging.getLogger(__name__)

SPLIT_MODES = ("row", "layer")  # "tensor" is upstream's other spelling of row


def split_mode_of(value: str | None) -> str:
    """The split mode a distributed run uses for ``--split-mode``: row (tensor parallel) unless
    ``layer`` is asked for; ``none`` cannot serve one model on several ranks."""
    mode = (value or "row").lower()
    if mode == "tensor":
        mode = "row"
    if mode not in SPLIT_MODES:
        raise DistributedError(f"--split-mode {value}: with several ranks the model must be split; "
                               "use row (tensor parallel) or layer (pipeline parallel)")
    return mode


def parse_tensor_split(value: str | None, n: int) -> list[float] | None:
    """``--tensor-split N0,N1,...`` as proportions, one per rank (None when not given)."""
    if not value:
        return None
    try:
        parts = [float(p) for p in value.replace("/", ",").split(",") if p.strip()]
    except ValueError as exc:
        raise DistributedError(f"--tensor-split {value}: expected numbers separated by commas") from exc
    if len(parts) != n or any(p <= 0 for p in parts):
        raise DistributedError(f"--tensor-split {value}: needs {n} positive proportions, one per rank")
    return parts


def unpacked_loading() -> None:
    """Make this process's loaders keep MLX's own linear modules, which ``shard_linear`` can split
    (quantized ones for the formats MLX runs, float for the rest); already MLX's choice on a GPU.
    A ``MLXCEL_WEIGHTS`` the user gave stays; the processes this one starts inherit the choice."""
    if settings().weights is None:
        set_switches(weights="quantized")


def sharder(group: mx.distributed.Group, mode: str, tensor_split: list[float] | None) -> Callable[[nn.Module], None]:
    """The loader hook that cuts a freshly built (not yet evaluated) model into this rank's shard."""
    def shard(model: nn.Module) -> None:
        if mode == "row":
            shard_rows(model, group, tensor_split)
        else:
            shard_layers(model, group, tensor_split)
    return shard


def shard_rows(model: nn.Module, group: mx.distributed.Group, tensor_split: list[float] | None) -> None:
    n = group.size()
    kind = getattr(model, "model_type", type(model).__module__)
    if not hasattr(model, "shard"):
        raise DistributedError(f"--split-mode row: mlx-lm's {kind} model has no tensor-parallel sharding; "
                               "families that have it include llama, qwen2, qwen3, qwen3_moe and deepseek_v3")
    if tensor_split is not None and len(set(tensor_split)) > 1:
        raise DistributedError("--split-mode row splits every matrix evenly (mlx-lm's shard_linear); "
                               "--tensor-split must give equal proportions, or use --split-mode layer")
    for layer in getattr(model, "layers", []):
        attn = getattr(layer, "self_attn", None)
        for what in ("n_heads", "n_kv_heads", "num_attention_heads", "num_key_value_heads"):
            count = getattr(attn, what, None)
            if isinstance(count, int) and count % n:
                raise DistributedError(f"--split-mode row: the {kind} model has {count} {what.replace('_', ' ')} "
                                       f"per layer, which {n} ranks cannot split evenly")
        break
    model.shard(group)
    packed = pack_sharded(model) if qmatmul.available() and not device.mlx_native() else 0
    log.info("tensor parallel: rank %d of %d holds 1/%d of every layer (%d layers packed for the CPU kernels)",
             group.rank(), n, n, packed)


def shard_layers(model: nn.Module, group: mx.distributed.Group, tensor_split: list[float] | None) -> None:
    inner = getattr(model, "model", None)
    kind = getattr(model, "model_type", type(model).__module__)
    if inner is None or not hasattr(inner, "pipeline"):
        raise DistributedError(f"--split-mode layer: mlx-lm's {kind} model has no pipeline-parallel support "
                               "(its PipelineMixin); families that have it include qwen2, qwen3_moe and "
                               "deepseek_v3; try --split-mode row")
    n_layers = len(inner.layers)
    split = None
    if tensor_split is not None:
        # mlx-lm gives rank 0 the last layers; --tensor-split lists ranks in order, as upstream lists devices
        total = sum(tensor_split)
        split = [max(1, round(n_layers * p / total)) for p in tensor_split]
        split[-1] += n_layers - sum(split)
        if split[-1] < 1:
            raise DistributedError(f"--tensor-split gives a rank no layers of {n_layers}")
    inner.pipeline(group, split)
    log.info("pipeline parallel: rank %d of %d holds layers %d..%d of %d", group.rank(), group.size(),
             inner.start_idx, inner.end_idx - 1, n_layers)


class PackedShardedToAllLinear(PackedLinear):
    """MLX's ``QuantizedShardedToAllLinear`` on the CPU kernels: this rank's columns of the matrix,
    then the ``all_sum`` that adds the ranks' partial products, then the bias."""

    def __init__(self, w: qmatmul.PackedWeight, group: mx.distributed.Group, bias: bool = False):
        super().__init__(w, bias=bias)
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        y = mx.distributed.all_sum(product(x, self.weight_spec), group=self.group)
        if "bias" in self:
            y = y + self.bias
        return y


def pack_sharded(model: nn.Module) -> int:
    """Swap mlx-lm's sharded quantized linears (4/8-bit affine) for packed ones; the count swapped."""
    swapped = 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if not isinstance(child, (QuantizedAllToShardedLinear, QuantizedShardedToAllLinear)):
                continue
            if child.mode != "affine" or child.bits not in (4, 8) or child.group_size not in (32, 64, 128):
                continue
            w = qmatmul.pack_affine(child["weight"], child["scales"], child["biases"], child.bits, child.group_size)
            has_bias = "bias" in child
            if isinstance(child, QuantizedShardedToAllLinear):
                new = PackedShardedToAllLinear(w, child.group, bias=has_bias)
            else:
                new = PackedLinear(w, bias=has_bias)
            if has_bias:
                new.bias = child["bias"]
            setattr(module, name, new)
            swapped += 1
    return swapped

