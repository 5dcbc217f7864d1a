"""GGUF metadata -> an mlx-lm model config (the ``config.json`` a Hugging Face checkpoint of
the same model would carry), so mlx-lm's own model class runs the weights.

Which architectures exist and how each maps is in ``architectures/``; this module picks one
for a file, refuses a file it cannot serve right with a message saying what is missing, and
checks the config against the mlx-lm class it is meant for.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.architectures import ARCHITECTURES, Architecture, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata

# Architectures llama.cpp writes whose model mlx-lm also has (module named), that mlxcel does not
# map yet: refused with the name of what is missing, the tensor and config mapping for that module.
_MLX_LM_MODULES = {
    "afmoe": "afmoe", "apertus": "apertus", "bailingmoe": "bailing_moe", "bailingmoe2": "bailing_moe", "bitnet": "bitnet",
    "cohere2": "cohere2", "command-r": "cohere", "dbrx": "dbrx", "deepseek": "deepseek", "dots1": "dots1",
    "ernie4_5-moe": "ernie4_5_moe", "exaone": "exaone", "exaone-moe": "exaone_moe", "falcon-h1": "falcon_h1",
    "gemma4": "gemma4_text", "glm-dsa": "glm_moe_dsa", "glm4": "glm4", "glm4moe": "glm4_moe", "gpt2": "gpt2",
    "gptj": "gptj", "gptneox": "gpt_neox", "granitehybrid": "granitemoehybrid", "hunyuan-dense": "hunyuan_v1_dense",
    "hunyuan-moe": "hunyuan", "internlm2": "internlm2", "jamba": "jamba", "kimi-linear": "kimi_linear",
    "lfm2moe": "lfm2_moe", "llama4": "llama4_text", "mamba": "mamba", "mamba2": "mamba2", "mimo2": "mimo_v2_flash",
    "minicpm": "minicpm", "minicpm3": "minicpm3", "minimax-m2": "minimax", "mistral3": "ministral3",
    "mistral4": "mistral4", "nemotron": "nemotron", "nemotron_h": "nemotron_h", "olmo": "olmo", "openelm": "openelm",
    "phi2": "phi", "phimoe": "phimoe", "plamo": "plamo", "plamo2": "plamo2", "plamo3": "plamo3", "qwen": "qwen",
    "rwkv7": "rwkv7", "stablelm": "stablelm", "starcoder": "gpt_bigcode", "step35": "step3p5",
}
NOT_YET: dict[str, str] = {
    arch: f"mlx-lm has a {module} model, but mlxcel does not yet map this architecture's GGUF tensors and "
          "metadata onto it" for arch, module in _MLX_LM_MODULES.items()
}


def architecture(metadata: dict[str, Any], source: str) -> tuple[str, Architecture]:
    arch = metadata.get("general.architecture")
    if not arch:
        raise ModelLoadError(f"{source} has no general.architecture; not a model GGUF")
    if arch not in ARCHITECTURES:
        why = NOT_YET.get(arch)
        detail = f" ({why})" if why else ""
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r} in {source}{detail}; mlxcel reads "
            + ", ".join(sorted(ARCHITECTURES))
        )
    return arch, ARCHITECTURES[arch]


def model_config(metadata: dict[str, Any], tensors: TensorIndex, vocab_size: int, source: str) -> dict[str, Any]:
    """The mlx-lm config for a GGUF model of a supported architecture."""
    arch, spec = architecture(metadata, source)
    meta = ArchMetadata(metadata, arch, source)
    why = spec.refusal(meta, tensors)
    if why:
        raise ModelLoadError(f"cannot serve GGUF architecture {arch!r} from {source}: {why}")
    config = spec.config(meta, tensors, vocab_size)
    _check_against_model_args(config, arch, source)
    return config


def _check_against_model_args(config: dict[str, Any], arch: str, source: str) -> None:
    """Refuse a file whose shape the mlx-lm class cannot express (an explicit head size on a
    class that always derives it from hidden / heads) rather than build a wrong model."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    fields = {f.name for f in dataclasses.fields(module.ModelArgs)}
    if "text_config" in fields:  # a wrapper (qwen3_5, gemma3n): its text model takes the config
        return
    head_dim = config.get("head_dim")
    derived = config["hidden_size"] // config["num_attention_heads"]
    if head_dim is not None and head_dim != derived and "head_dim" not in fields:
        raise ModelLoadError(
            f"cannot serve GGUF architecture {arch!r} from {source}: its attention heads are {head_dim} wide "
            f"(not hidden/heads = {derived}), which mlx-lm's {config['model_type']} model cannot express"
        )
