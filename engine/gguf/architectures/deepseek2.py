"""``deepseek2``: DeepSeek V2 / V2-Lite / V2.5 / V3 / R1 and the models built on them (Kimi K2,
GigaChat 3, ...): multi-head latent attention with mixture-of-experts.

The converter splits MLA's ``kv_b_proj`` into ``attn_k_b`` (transposed, per head) and
``attn_v_b`` for llama.cpp's absorbed attention; mlx-lm's deepseek_v3 holds exactly those two
(``embed_q``, ``unembed_out``), and its deepseek_v2 the fused matrix, rebuilt here. Files from
before the split carry ``attn_kv_b`` itself. The file's ``head_count_kv`` (1: MLA as one shared
latent head) and ``key_length`` (latent rank + rope dims) describe llama.cpp's view; the head
sizes come from ``key_length_mla`` / ``value_length_mla`` when present. Sigmoid routing with a
score-correction bias (V3, R1, Kimi) is mlx-lm's deepseek_v3; softmax routing (V2; the default for
files that do not say, as llama.cpp assumes) is deepseek_v2. ``rope.scaling.yarn_log_multiplier``
holds 0.1 x YaRN's ``mscale_all_dim``.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx

from mlxcel.engine.gguf.architectures.base import Architecture, Conversion, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata

SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
_ATTN = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(embed_q|unembed_out|kv_b_proj)\.weight$")


class Deepseek2(Architecture):
    name = "deepseek2"
    model_type = "deepseek_v2"
    hf_class = "DeepseekV2ForCausalLM"
    partial_rotary = True  # MLA rotates only the qk_rope_head_dim part of each head

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        n_head = config["num_attention_heads"]
        rope_dim = meta.int("rope.dimension_count")
        key_length = meta.int("attention.key_length_mla", 0) or meta.int("attention.key_length")
        value_length = meta.int("attention.value_length_mla", 0) or meta.int("attention.value_length")
        sigmoid = meta.int("expert_gating_func", 1) == SIGMOID
        n_group = meta.int("expert_group_count", 1)
        config.update(
            num_key_value_heads=n_head,
            head_dim=None,
            kv_lora_rank=meta.int("attention.kv_lora_rank"),
            q_lora_rank=meta.int("attention.q_lora_rank", 0) or None,
            qk_rope_head_dim=rope_dim,
            qk_nope_head_dim=key_length - rope_dim,
            v_head_dim=value_length,
            moe_intermediate_size=meta.int("expert_feed_forward_length", 0) or config.get("intermediate_size"),
            n_routed_experts=meta.int("expert_count", 0) or None,
            n_shared_experts=meta.int("expert_shared_count", 0) or None,
            num_experts_per_tok=meta.int("expert_used_count", 0) or None,
            routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
            norm_topk_prob=meta.bool("expert_weights_norm", False),
            first_k_dense_replace=meta.int("leading_dense_block_count", 0),
            moe_layer_freq=1,
            n_group=n_group,
            topk_group=meta.int("expert_group_used_count", 1),
        )
        config.pop("head_dim")
        if sigmoid:
            config.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], topk_method="noaux_tc",
                          scoring_func="sigmoid")
        else:
            config["topk_method"] = "group_limited_greedy" if n_group > 1 else "greedy"
        scaling = config.get("rope_scaling")
        if scaling and scaling.get("rope_type") == "yarn":
            scaling["mscale"] = 1.0
            scaling["mscale_all_dim"] = meta.float("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        elif config["model_type"] == "deepseek_v2":
            # mlx-lm's deepseek_v2 reads its rope_scaling unconditionally; a factor of 1 is none at all
            config["rope_scaling"] = {"type": "yarn", "rope_type": "yarn", "factor": 1.0, "mscale": 1.0,
                                      "mscale_all_dim": 0.0,
                                      "original_max_position_embeddings": config["max_position_embeddings"]}
        return config

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if meta.has("attention.temperature_scale"):
            return "attention temperature tuning (attention.temperature_scale), which mlx-lm's deepseek models lack"
        return None

    def conversion(self, param: str, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> Conversion | None:
        match = _ATTN.match(param)
        if match is None:
            return super().conversion(param, config, meta, tensors)
        bid, which = match.groups()
        k_b, v_b, kv_b = (f"blk.{bid}.attn_{t}.weight" for t in ("k_b", "v_b", "kv_b"))
        heads, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
        if which == "kv_b_proj":  # deepseek_v2: the fused (heads * (nope + v), latent) matrix
            if kv_b in tensors:
                return Conversion((kv_b,))
            if k_b in tensors and v_b in tensors:
                return Conversion((k_b, v_b), value=lambda k, v: mx.concatenate([k.swapaxes(-1, -2), v], axis=1)
                                  .reshape(-1, k.shape[1]))
            return None
        if k_b in tensors:  # deepseek_v3: absorbed per-head matrices, as the file stores them
            return Conversion((k_b if which == "embed_q" else v_b,))
        if kv_b in tensors:
            def split(kv, which=which):
                per_head = kv.reshape(heads, -1, kv.shape[-1])
                return per_head[:, :nope].swapaxes(-1, -2) if which == "embed_q" else per_head[:, nope:]
            return Conversion((kv_b,), value=split)
        return None
