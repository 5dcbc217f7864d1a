"""``starcoder2``: StarCoder 2 (and the Granite code models written with it).

LayerNorms with biases, biased projections and a two-matrix GELU MLP; the converter changes
nothing but the names.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata


class Starcoder2(Architecture):
    name = "starcoder2"
    model_type = "starcoder2"
    hf_class = "Starcoder2ForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config["norm_epsilon"] = meta.float("attention.layer_norm_epsilon", 1e-5)
        return config
