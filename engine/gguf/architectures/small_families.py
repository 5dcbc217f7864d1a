"""Smaller dense families that map onto mlx-lm with one or two config keys of their own:
``ernie4_5`` (ERNIE 4.5 dense) and ``exaone4`` (EXAONE 4.0).

ERNIE 4.5 rotates interleaved pairs (llama.cpp's NORM RoPE, mlx-lm's traditional RoPE), written
without a permutation; its fused ``qkv_proj`` arrives split. EXAONE 4.0's larger sizes interleave
three sliding-window layers with one global layer that has no rotary embedding at all (llama.cpp's
default pattern, or the file's); Llama 3 style scaling comes as ``rope_freqs``, applied exactly.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, TensorIndex
from mlxcel.engine.gguf.architectures.llama import apply_rope_freqs
from mlxcel.engine.gguf.metadata import ArchMetadata


class Ernie45(Architecture):
    name = "ernie4_5"
    model_type = "ernie4_5"
    hf_class = "Ernie4_5_ForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config["use_bias"] = "blk.0.attn_q.bias" in tensors
        return config


class Exaone4(Architecture):
    name = "exaone4"
    model_type = "exaone4"
    hf_class = "Exaone4ForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        n = config["num_hidden_layers"]
        window = meta.int("attention.sliding_window", 4096 if n == 64 else 0)
        pattern = None
        if window:
            stored = meta.raw("attention.sliding_window_pattern")
            if stored is not None and hasattr(stored, "__len__"):
                pattern = "".join("L" if v else "G" for v in stored[:n])
            else:
                period = int(stored or 4)
                pattern = "".join("L" if (i + 1) % period else "G" for i in range(period))
        config.update(sliding_window=window or None, sliding_window_pattern=pattern,
                      rope_scaling=config.get("rope_scaling"))
        return config

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if meta.has("rope.freq_base_swa") and meta.float("rope.freq_base_swa") != meta.float("rope.freq_base", 10000.0):
            return "a separate RoPE base for its sliding-window layers, which mlx-lm's exaone4 does not take"
        return None

    def finish(self, model, gguf_file, config: dict) -> None:
        if "rope_freqs.weight" in gguf_file.tensors:
            apply_rope_freqs(model, gguf_file, config)
