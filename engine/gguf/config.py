"""GGUF metadata -> an mlx-lm model config (the ``config.json`` a Hugging Face checkpoint of
the same model would carry), so mlx-lm's own model class runs the weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxcel.engine.errors import ModelLoadError


@dataclass(frozen=True)
class Architecture:
    """How one ``general.architecture`` value maps onto mlx-lm."""

    model_type: str  # mlx-lm module name
    permuted_qk: bool  # whether convert_hf_to_gguf reordered q/k rows for interleaved RoPE
    hf_class: str


ARCHITECTURES = {
    "llama": Architecture("llama", permuted_qk=True, hf_class="LlamaForCausalLM"),
    "qwen2": Architecture("qwen2", permuted_qk=False, hf_class="Qwen2ForCausalLM"),
    "qwen3": Architecture("qwen3", permuted_qk=False, hf_class="Qwen3ForCausalLM"),
}


def architecture(metadata: dict[str, Any], source: str) -> tuple[str, Architecture]:
    arch = metadata.get("general.architecture")
    if not arch:
        raise ModelLoadError(f"{source} has no general.architecture; not a model GGUF")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r} in {source}; mlxcel reads "
            + ", ".join(sorted(ARCHITECTURES))
        )
    return arch, ARCHITECTURES[arch]


def _int(metadata: dict, key: str, source: str, default: int | None = None) -> int:
    value = metadata.get(key, default)
    if value is None:
        raise ModelLoadError(f"{source} lacks required metadata {key}")
    if hasattr(value, "__len__"):
        # Per-layer arrays (e.g. head_count_kv varying by layer) are not something these
        # architectures use; refuse rather than guess.
        values = {int(v) for v in value}
        if len(values) != 1:
            raise ModelLoadError(f"{source}: per-layer {key} values {sorted(values)} are not supported")
        value = values.pop()
    return int(value)


def model_config(metadata: dict[str, Any], tensor_names: set[str], vocab_size: int, source: str) -> dict[str, Any]:
    """The mlx-lm config for a GGUF model of a supported architecture."""
    arch, spec = architecture(metadata, source)

    def key(name: str) -> str:
        return f"{arch}.{name}"

    hidden = _int(metadata, key("embedding_length"), source)
    n_head = _int(metadata, key("attention.head_count"), source)
    n_kv = _int(metadata, key("attention.head_count_kv"), source, default=n_head)
    head_dim = _int(metadata, key("attention.key_length"), source, default=hidden // n_head)
    rope_dim = _int(metadata, key("rope.dimension_count"), source, default=head_dim)
    if rope_dim != head_dim:
        raise ModelLoadError(f"{source}: partial rotary embeddings ({rope_dim} of {head_dim} dims) are not supported")
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "architectures": [spec.hf_class],
        "hidden_size": hidden,
        "intermediate_size": _int(metadata, key("feed_forward_length"), source),
        "num_hidden_layers": _int(metadata, key("block_count"), source),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rms_norm_eps": float(metadata.get(key("attention.layer_norm_rms_epsilon"), 1e-6)),
        "rope_theta": float(metadata.get(key("rope.freq_base"), 10000.0)),
        "max_position_embeddings": _int(metadata, key("context_length"), source, default=4096),
        "vocab_size": vocab_size,
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    if spec.model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_names
    scaling = rope_scaling(metadata, arch, "rope_freqs.weight" in tensor_names)
    if scaling is not None:
        config["rope_scaling"] = scaling
    return config


def rope_scaling(metadata: dict[str, Any], arch: str, has_rope_freqs: bool) -> dict[str, Any] | None:
    """Hugging Face style ``rope_scaling`` from ``{arch}.rope.scaling.*``.

    Llama 3.x GGUFs carry their scaling as a ``rope_freqs`` tensor of per-frequency divisors
    instead of parameters; for those we declare llama3 scaling here and the loader replaces
    the computed frequencies with the stored ones (see ``gguf_loader.apply_rope_freqs``)."""
    kind = metadata.get(f"{arch}.rope.scaling.type")
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    original = metadata.get(f"{arch}.rope.scaling.original_context_length")
    if has_rope_freqs:
        return {"rope_type": "llama3", "factor": 1.0, "original_max_position_embeddings": int(original or 8192)}
    if not kind or kind == "none" or not factor or float(factor) == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": float(factor)}
        if original:
            out["original_max_position_embeddings"] = int(original)
        for gguf_key, hf_key in (("rope.scaling.yarn_beta_fast", "beta_fast"), ("rope.scaling.yarn_beta_slow", "beta_slow")):
            if f"{arch}.{gguf_key}" in metadata:
                out[hf_key] = float(metadata[f"{arch}.{gguf_key}"])
        return out
    raise ModelLoadError(f"unsupported RoPE scaling type {kind!r} in GGUF metadata")
