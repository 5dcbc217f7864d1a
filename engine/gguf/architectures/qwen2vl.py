"""``qwen2vl``: the text model of Qwen2-VL and Qwen2.5-VL, as the converter writes it.

Its tensors are Qwen2's; what differs is its rotary embedding, M-RoPE: ``rope.dimension_sections``
says how many of the rotary frequency pairs turn with an image token's time, row and column
position. For text every axis is at the same position and M-RoPE is ordinary RoPE, so mlx-lm's
qwen2 class runs it; the sections go into the config as a Hugging Face checkpoint states them
(``rope_scaling.mrope_section``), where the vision tower's position planning reads them
(``engine.vision.positions``).
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import TensorIndex
from mlxcel.engine.gguf.architectures.qwen import Qwen2
from mlxcel.engine.gguf.metadata import ArchMetadata


class Qwen2VL(Qwen2):
    name = "qwen2vl"
    hf_class = "Qwen2VLForConditionalGeneration"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        raw = meta.raw("rope.dimension_sections")
        sections = [int(s) for s in (raw if raw is not None else []) if int(s)]
        if sections:
            config["rope_scaling"] = {"type": "mrope", "mrope_section": sections[:3]}
        return config
