"""``granite`` and ``granitemoe``: IBM Granite 3.x dense and mixture-of-experts models.

Granite is llama with four multipliers (``embedding_scale``, ``residual_scale``, ``attention.scale``
and ``logit_scale``, which llama.cpp divides the logits by), and the converter permutes q/k as it
does for llama. llama.cpp treats an absent embedding or residual scale as 1 and an absent
attention scale as ``1/sqrt(head_dim)``. Granite-MoE's fused ``input_linear`` arrives split into
gate and up expert tensors.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata


class Granite(Architecture):
    name = "granite"
    model_type = "granite"
    hf_class = "GraniteForCausalLM"
    permuted_qk = True

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config.update(
            logits_scaling=meta.float("logit_scale"),
            attention_multiplier=meta.float("attention.scale", 0.0) or config["head_dim"] ** -0.5,
            embedding_multiplier=meta.float("embedding_scale", 0.0) or 1.0,
            residual_multiplier=meta.float("residual_scale", 0.0) or 1.0,
            attention_bias="blk.0.attn_q.bias" in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
        )
        return config

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if not meta.bool("rope.scaling.finetuned", True):
            return "RoPE switched off (rope.scaling.finetuned = false), which mlx-lm's granite always applies"
        if "blk.0.ffn_up_shexp.weight" in tensors:
            return "a shared expert (Granite-MoE-Shared), which mlx-lm's granitemoe does not build"
        return None


class GraniteMoe(Granite):
    name = "granitemoe"
    model_type = "granitemoe"
    hf_class = "GraniteMoeForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = super().config(meta, tensors, vocab_size)
        config.update(num_local_experts=meta.int("expert_count"), num_experts_per_tok=meta.int("expert_used_count"))
        config.pop("mlp_bias")
        return config
