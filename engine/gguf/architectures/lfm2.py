"""``lfm2``: Liquid AI's LFM2 / LFM2.5 hybrids of gated short convolutions and attention.

A layer is a convolution layer where the file's per-layer ``head_count_kv`` is 0 (llama.cpp's
rule); the converter squeezes each depthwise kernel to (channels, width), which mlx-lm's
``Conv1d`` holds as (channels, width, 1). The output head is always the embedding matrix, and
``token_embd_norm`` is the final norm (mlx-lm's ``embedding_norm``).
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata


class Lfm2(Architecture):
    name = "lfm2"
    model_type = "lfm2"
    hf_class = "Lfm2ForCausalLM"

    def kv_heads(self, meta: ArchMetadata, n_head: int) -> int:
        return max(int(v) for v in meta.per_layer("attention.head_count_kv", self.n_layers(meta), n_head))

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        n = config["num_hidden_layers"]
        kv = meta.per_layer("attention.head_count_kv", n, config["num_attention_heads"])
        layer_types = ["full_attention" if int(h) > 0 else "conv" for h in kv]
        first_conv = layer_types.index("conv") if "conv" in layer_types else 0
        config.update(
            norm_eps=config["rms_norm_eps"],
            conv_bias=f"blk.{first_conv}.shortconv.in_proj.bias" in tensors,
            conv_L_cache=meta.int("shortconv.l_cache"),
            block_dim=config["hidden_size"],
            block_ff_dim=config["intermediate_size"],
            block_multiple_of=1,
            block_ffn_dim_multiplier=1.0,
            block_auto_adjust_ff_dim=False,
            layer_types=layer_types,
        )
        return config

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if meta.int("attention.sliding_window", 0):
            return "sliding-window attention, which mlx-lm's lfm2 does not have"
        if "output.weight" in tensors:
            return "an output head separate from the embeddings, which mlx-lm's lfm2 does not have"
        return None
