"""``qwen3next``, ``qwen35``, ``qwen35moe``: Qwen3-Next and the Qwen3.5 family, hybrids of
gated-delta-net linear attention and gated full attention (every ``full_attention_interval``-th
layer; llama.cpp's ``recurrent_layers`` flags when the file has them).

What the converter changes, undone here:

- ``A_log`` is stored as ``A = -exp(A_log)`` (``ssm_a``); ``dt_bias`` as ``ssm_dt.bias``;
  convolution kernels squeezed to (channels, width);
- the other norms are stored zero-centred-plus-one, which is what mlx-lm holds after its own
  ``sanitize`` (nothing to undo);
- Qwen3-Next's fused ``in_proj_qkvz`` (q, k, v, z grouped per key head) arrives split into
  ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (all z): regrouped by rows;
- Qwen3.5 with fewer key heads than value heads has its value heads reordered from grouped
  (by key head) to tiled for ggml's broadcasting, in every tensor that holds them: put back.
- next-token-prediction layers appended after ``block_count - nextn_predict_layers`` are not run.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.engine.gguf.architectures.base import Architecture, Conversion, TensorIndex
from mlxcel.engine.gguf.architectures.qwen import dense_layers, expert_config
from mlxcel.engine.gguf.metadata import ArchMetadata

_LINEAR = re.compile(r"^(?:language_model\.)?model\.layers\.(\d+)\.linear_attn\.(\w+)\.?(weight|bias)?$")


def _log_minus(a: mx.array) -> mx.array:
    """``A_log`` from the stored ``-exp(A_log)``."""
    return mx.log(-a)


def grouped_from_tiled(n_k: int, per_k: int, head_dim: int) -> np.ndarray:
    """Indices that take value-head rows stored tiled (``[k0 v0, k1 v0, ..., k0 v1, ...]``, the
    converter's order) back to grouped by key head (``[k0 v0, k0 v1, ..., k1 v0, ...]``)."""
    return np.arange(n_k * per_k * head_dim).reshape(per_k, n_k, head_dim).transpose(1, 0, 2).reshape(-1)


class Qwen3Next(Architecture):
    name = "qwen3next"
    model_type = "qwen3_next"
    hf_class = "Qwen3NextForCausalLM"
    partial_rotary = True
    reorders_value_heads = False

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        n_v = meta.int("ssm.time_step_rank")
        config.update(
            linear_num_value_heads=n_v,
            linear_num_key_heads=meta.int("ssm.group_count"),
            linear_key_head_dim=meta.int("ssm.state_size"),
            linear_value_head_dim=meta.int("ssm.inner_size") // n_v,
            linear_conv_kernel_dim=meta.int("ssm.conv_kernel"),
            full_attention_interval=self.interval(meta),
            partial_rotary_factor=meta.int("rope.dimension_count", config["head_dim"]) / config["head_dim"],
        )
        self.moe_config(meta, tensors, config)
        return config

    def moe_config(self, meta: ArchMetadata, tensors: TensorIndex, config: dict) -> None:
        config.update(
            **expert_config(meta),
            shared_expert_intermediate_size=meta.int("expert_shared_feed_forward_length", 0),
            decoder_sparse_step=1,
            norm_topk_prob=True,
        )
        config.setdefault("intermediate_size", config["moe_intermediate_size"])
        config["mlp_only_layers"] = dense_layers(config, tensors)

    def interval(self, meta: ArchMetadata) -> int:
        n = self.n_layers(meta)
        stored = meta.raw("attention.recurrent_layers")
        if stored is None or not hasattr(stored, "__len__"):
            return meta.int("full_attention_interval", 4)
        flags = [bool(v) for v in stored][:n]
        for period in range(1, n + 1):
            if flags == [(i + 1) % period != 0 for i in range(n)]:
                return period
        return -1

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if self.interval(meta) < 0:
            return "a linear/full attention layer pattern that is not one full layer every N, the only one mlx-lm builds"
        return None

    def conversion(self, param: str, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> Conversion | None:
        match = _LINEAR.match(param)
        if match is None:
            return super().conversion(param, config, meta, tensors)
        bid, what, _ = match.groups()
        if what == "in_proj_qkvz":
            return self._qkvz(bid, config, tensors)
        conv = super().conversion(param, config, meta, tensors)
        if conv is None:
            return None
        if what == "A_log":
            conv.value = _log_minus
        if self.reorders_value_heads:
            self._regroup(conv, what, config)
        return conv

    def _qkvz(self, bid: str, config: dict, tensors: TensorIndex) -> Conversion | None:
        qkv, gate = f"blk.{bid}.attn_qkv.weight", f"blk.{bid}.attn_gate.weight"
        if qkv not in tensors or gate not in tensors:
            fused = f"blk.{bid}.ssm_in.weight"  # older files: the four parts, each over all heads
            if fused not in tensors:
                return None
            qkv, gate = fused, None
        n_k, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
        per_k_v = config["linear_num_value_heads"] // n_k * config["linear_value_head_dim"]
        key, value = n_k * dk, n_k * per_k_v
        order = []
        for g in range(n_k):  # mlx-lm (and the checkpoint) group q, k, v, z by key head
            order += [range(g * dk, (g + 1) * dk), range(key + g * dk, key + (g + 1) * dk),
                      range(2 * key + g * per_k_v, 2 * key + (g + 1) * per_k_v),
                      range(2 * key + value + g * per_k_v, 2 * key + value + (g + 1) * per_k_v)]
        rows = np.concatenate([np.fromiter(r, dtype=np.int64) for r in order])
        return Conversion((qkv,) if gate is None else (qkv, gate), rows=rows)

    def _regroup(self, conv: Conversion, what: str, config: dict) -> None:
        """Undo the converter's tiling of value heads (Qwen3.5 with fewer key than value heads)."""
        n_k, n_v = config["linear_num_key_heads"], config["linear_num_value_heads"]
        if n_k == n_v:
            return
        per_k, dv, dk = n_v // n_k, config["linear_value_head_dim"], config["linear_key_head_dim"]
        heads = grouped_from_tiled(n_k, per_k, 1)
        if what in ("in_proj_qkv", "conv1d"):
            qk = np.arange(2 * n_k * dk)
            conv.rows = np.concatenate([qk, 2 * n_k * dk + grouped_from_tiled(n_k, per_k, dv)])
        elif what == "in_proj_z":
            conv.rows = grouped_from_tiled(n_k, per_k, dv)
        elif what in ("in_proj_a", "in_proj_b", "dt_bias"):
            conv.rows = heads
        elif what == "A_log":
            conv.value = lambda a: mx.log(-a)[mx.array(heads)]
        elif what == "out_proj":
            columns = mx.array(grouped_from_tiled(n_k, per_k, dv))
            conv.value = lambda w: w[:, columns]


class Qwen35(Qwen3Next):
    name = "qwen35"
    model_type = "qwen3_5"
    hf_class = "Qwen3_5ForCausalLM"
    reorders_value_heads = True

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = super().config(meta, tensors, vocab_size)
        sections = [int(v) for v in meta.per_layer("rope.dimension_sections", 4, 0)][:3] \
            if meta.has("rope.dimension_sections") else [11, 11, 10]
        config["rope_parameters"] = {"type": "default", "mrope_section": sections, "rope_theta": config["rope_theta"],
                                     "partial_rotary_factor": config["partial_rotary_factor"]}
        config.pop("rope_scaling", None)
        return config

    def moe_config(self, meta: ArchMetadata, tensors: TensorIndex, config: dict) -> None:
        return None


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    model_type = "qwen3_5_moe"
    hf_class = "Qwen3_5MoeForCausalLM"

    def moe_config(self, meta: ArchMetadata, tensors: TensorIndex, config: dict) -> None:
        Qwen3Next.moe_config(self, meta, tensors, config)
