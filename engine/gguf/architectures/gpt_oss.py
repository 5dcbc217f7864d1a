"""``gpt-oss``: OpenAI's GPT-OSS mixture-of-experts models.

Attention sinks (one learned logit per head, ``attn_sinks``), sliding-window attention on every
other layer starting with the first (llama.cpp's default pattern, or the file's), YaRN-scaled
RoPE, biased projections and experts whose gate and up rows the converter has already
de-interleaved into ``ffn_gate_exps`` / ``ffn_up_exps`` (MXFP4 blocks in released files,
dequantized here).
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata


class GptOss(Architecture):
    name = "gpt-oss"
    model_type = "gpt_oss"
    hf_class = "GptOssForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        n = config["num_hidden_layers"]
        stored = meta.raw("attention.sliding_window_pattern")
        if stored is not None and hasattr(stored, "__len__"):
            sliding = [bool(v) for v in stored][:n]
        else:
            period = int(stored or 2)
            sliding = [i % period < period - 1 for i in range(n)]
        config.update(
            num_local_experts=meta.int("expert_count"),
            num_experts_per_tok=meta.int("expert_used_count"),
            intermediate_size=meta.int("expert_feed_forward_length"),
            sliding_window=meta.int("attention.sliding_window"),
            layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        )
        return config

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if meta.has("rope.freq_base_swa") and meta.float("rope.freq_base_swa") != meta.float("rope.freq_base", 10000.0):
            return "a separate RoPE base for its sliding-window layers, which mlx-lm's gpt_oss does not take"
        return None
