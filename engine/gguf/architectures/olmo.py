"""``olmo2``: OLMo 2, and OLMo 3 (the same tensors plus interleaved sliding-window layers).

OLMo 2 normalises the whole q and k projections and puts its norms after attention and after
the feed-forward block; the converter changes nothing. An OLMo 3 file carries
``attention.sliding_window`` and a per-layer pattern (llama.cpp's default: three sliding layers,
then one global), which mlx-lm's olmo3 builds from ``layer_types``.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata


class Olmo2(Architecture):
    name = "olmo2"
    model_type = "olmo2"
    hf_class = "Olmo2ForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
        window = meta.int("attention.sliding_window", 0)
        if window:
            n = config["num_hidden_layers"]
            stored = meta.raw("attention.sliding_window_pattern")
            if stored is None or not hasattr(stored, "__len__"):
                period = int(stored or 4)
                sliding = [i % period < period - 1 for i in range(n)]
            else:
                sliding = [bool(v) for v in stored][:n]
            config.update(model_type="olmo3", architectures=["Olmo3ForCausalLM"], sliding_window=window,
                          layer_types=["sliding_attention" if s else "full_attention" for s in sliding])
        return config

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if meta.int("attention.sliding_window", 0) and meta.has("rope.freq_base_swa") \
                and meta.float("rope.freq_base_swa") != meta.float("rope.freq_base", 10000.0):
            return "a separate RoPE base for its sliding-window layers, which mlx-lm's olmo3 does not take"
        return None


class Olmoe(Architecture):
    """``olmoe``: OLMoE, OLMo's full-width q/k norms with stacked experts; llama.cpp does not
    renormalise the chosen experts' weights (nor does the model)."""

    name = "olmoe"
    model_type = "olmoe"
    hf_class = "OlmoeForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config.update(num_experts=meta.int("expert_count"), num_experts_per_tok=meta.int("expert_used_count"),
                      norm_topk_prob=False, attention_bias="blk.0.attn_q.bias" in tensors)
        return config
