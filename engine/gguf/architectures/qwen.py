"""``qwen2``, ``qwen3``, ``qwen2moe``, ``qwen3moe``: Qwen 1.5-3 dense and mixture-of-experts.

The converter writes these in Hugging Face's rotary layout (llama.cpp runs them with NEOX RoPE),
so no rows move; experts arrive stacked (``ffn_*_exps``), as mlx-lm's ``switch_mlp`` holds them.
llama.cpp normalises the chosen experts' weights for qwen3moe and not for qwen2moe, as the
Hugging Face models do.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata


def dense_layers(config: dict, tensors: TensorIndex) -> list[int]:
    """Layers with a plain feed-forward block instead of experts (no router tensor)."""
    return [i for i in range(config["num_hidden_layers"]) if f"blk.{i}.ffn_gate_inp.weight" not in tensors]


class Qwen2(Architecture):
    name = "qwen2"
    model_type = "qwen2"
    hf_class = "Qwen2ForCausalLM"


class Qwen3(Architecture):
    name = "qwen3"
    model_type = "qwen3"
    hf_class = "Qwen3ForCausalLM"


def expert_config(meta: ArchMetadata) -> dict[str, int]:
    """The expert counts and width every Qwen MoE file gives (qwen2moe, qwen3moe, the Qwen3.5/Next MoE)."""
    return {"num_experts": meta.int("expert_count"), "num_experts_per_tok": meta.int("expert_used_count"),
            "moe_intermediate_size": meta.int("expert_feed_forward_length")}


class Qwen2Moe(Architecture):
    name = "qwen2moe"
    model_type = "qwen2_moe"
    hf_class = "Qwen2MoeForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config.update(
            **expert_config(meta),
            shared_expert_intermediate_size=meta.int("expert_shared_feed_forward_length", 0),
        )
        config.setdefault("intermediate_size", config["moe_intermediate_size"])
        return config

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if any(f"blk.{i}.ffn_gate_inp.weight" not in tensors for i in range(self.n_layers(meta))):
            return "dense (non-expert) layers inside a qwen2moe file, which mlx-lm's qwen2_moe does not build"
        if "blk.0.ffn_up_shexp.weight" not in tensors:
            return "a qwen2moe file without the shared expert mlx-lm's qwen2_moe always has"
        return None


class Qwen3Moe(Architecture):
    name = "qwen3moe"
    model_type = "qwen3_moe"
    hf_class = "Qwen3MoeForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config.update(
            **expert_config(meta),
            decoder_sparse_step=1,
            norm_topk_prob=True,
        )
        config.setdefault("intermediate_size", config["moe_intermediate_size"])
        config["mlp_only_layers"] = dense_layers(config, tensors)
        return config
