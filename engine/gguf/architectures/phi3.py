"""``phi3``: Phi-3, Phi-3.5 and Phi-4 (mini) text models.

The converter keeps Phi-3's fused projections (``attn_qkv``, and ``ffn_up`` holding gate and up),
which mlx-lm's phi3 fuses the same way. A partial rotary dimension comes from
``rope.dimension_count``; LongRoPE's per-frequency factors are stored as tensors
(``rope_factors_long`` / ``rope_factors_short``) and given to mlx-lm's LongRoPE, which rotates with
the long factors at every length, as llama.cpp does whenever the context exceeds the original
training context (its default, the trained context, always does). llama.cpp disables Phi's
sliding window; so does mlx-lm.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata

LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


class Phi3(Architecture):
    name = "phi3"
    model_type = "phi3"
    hf_class = "Phi3ForCausalLM"
    partial_rotary = True
    ignored = (LONG, SHORT)

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        rope_dim = meta.int("rope.dimension_count", config["head_dim"])
        config["partial_rotary_factor"] = rope_dim / config["head_dim"]
        config["original_max_position_embeddings"] = meta.int("rope.scaling.original_context_length",
                                                               config["max_position_embeddings"])
        if LONG in tensors:
            config["rope_scaling"] = {
                "type": "longrope",
                "long_factor": [float(v) for v in tensors.values(LONG).reshape(-1)],
                "short_factor": [float(v) for v in tensors.values(SHORT if SHORT in tensors else LONG).reshape(-1)],
            }
        return config
