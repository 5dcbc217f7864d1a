"""``llama``: Llama 1-3.x, Mistral, SmolLM, and Mixtral (a llama file with expert tensors).

convert_hf_to_gguf writes Mistral and Mixtral checkpoints as ``llama`` too, and permutes every
q/k projection for llama.cpp's interleaved RoPE (undone here). Mistral's sliding window is not
written to the file and llama.cpp attends over the whole context, as mlx-lm's llama does.
Llama 3.x scaling comes as a ``rope_freqs`` tensor of per-frequency divisors, applied exactly
(``apply_rope_freqs``). Old Mixtral files hold one tensor per expert (``ffn_gate.E``): stacked.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import Llama3RoPE

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.architectures.base import Architecture, Conversion, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata
from mlxcel.engine.gguf.tensors import dequantize_numpy

_EXPERT_PARAM = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.switch_mlp\.(gate|up|down)_proj\.weight$")


class Llama(Architecture):
    name = "llama"
    model_type = "llama"
    hf_class = "LlamaForCausalLM"
    permuted_qk = True

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        n_expert = meta.int("expert_count", 0) if self.model_type == "llama" else 0
        if n_expert:
            config.update(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=n_expert,
                          num_experts_per_tok=meta.int("expert_used_count"))
        else:
            config["attention_bias"] = "blk.0.attn_q.bias" in tensors
            config["mlp_bias"] = "blk.0.ffn_up.bias" in tensors
        return config

    def conversion(self, param: str, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> Conversion | None:
        conv = super().conversion(param, config, meta, tensors)
        if conv is None and (match := _EXPERT_PARAM.match(param)):
            bid, proj = match.groups()
            per_expert = tuple(f"blk.{bid}.ffn_{proj}.{e}.weight" for e in range(config["num_local_experts"]))
            if all(name in tensors for name in per_expert):
                return Conversion(per_expert, value=lambda *experts: mx.stack(experts))
        return conv

    def finish(self, model: nn.Module, gguf_file, config: dict) -> None:
        if "rope_freqs.weight" in gguf_file.tensors:
            apply_rope_freqs(model, gguf_file, config)


def apply_rope_freqs(model: nn.Module, gguf_file, config: dict) -> None:
    """Llama 3.x: use the stored per-frequency divisors (``rope_freqs``) exactly.

    llama.cpp rotates dimension pair i by ``pos * theta^(-2i/d) / rope_freqs[i]``. mlx-lm's
    ``Llama3RoPE`` passes wavelengths ``theta^(2i/d)`` (times its own correction) to
    ``mx.fast.rope``; we overwrite them with ``theta^(2i/d) * rope_freqs[i]`` so the stored
    factors, not a recomputation from parameters the GGUF does not carry, decide the result."""
    factors = mx.array(dequantize_numpy(gguf_file.tensors["rope_freqs.weight"]).reshape(-1))
    dims = config["head_dim"]
    base = mx.array(config["rope_theta"], dtype=mx.float32) ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    if factors.size != base.size:
        raise ModelLoadError(f"{gguf_file.path}: rope_freqs has {factors.size} entries, expected {base.size}")
    for layer in model.layers:
        rope = getattr(layer.self_attn, "rope", None)
        if rope is None:  # a layer without rotary embeddings (EXAONE 4's global layers)
            continue
        if not isinstance(rope, Llama3RoPE):
            raise ModelLoadError(f"{gguf_file.path}: rope_freqs present but {config['model_type']} does not use llama3 RoPE")
        rope._freqs = base * factors


class SmolLM3(Llama):
    """``smollm3``: SmolLM3, llama with rotary embeddings left out of every fourth layer
    (llama.cpp's fixed step; the file does not say)."""

    name = "smollm3"
    model_type = "smollm3"
    hf_class = "SmolLM3ForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = super().config(meta, tensors, vocab_size)
        config["no_rope_layer_interval"] = 4
        return config


class SeedOss(Architecture):
    """``seed_oss``: ByteDance Seed-OSS, llama-like with biased q/k/v (and optionally output)
    projections, written without the q/k permutation."""

    name = "seed_oss"
    model_type = "seed_oss"
    hf_class = "SeedOssForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        config.update(attention_bias="blk.0.attn_q.bias" in tensors,
                      attention_out_bias="blk.0.attn_output.bias" in tensors,
                      mlp_bias="blk.0.ffn_up.bias" in tensors)
        return config
