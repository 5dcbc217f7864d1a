"""Tiny LoRA adapters for the tiny checkpoints of ``tiny_checkpoints``, written in the two layouts
mlxcel reads, with the exact names and metadata each tool writes:

- ``write_gguf_adapter``: what llama.cpp's ``convert_lora_to_gguf.py`` writes for a PEFT adapter of a
  llama model: ``general.type = adapter``, ``general.architecture``, ``adapter.type = lora``,
  ``adapter.lora.alpha``, and ``blk.N.<tensor>.weight.lora_a`` ``[rank, in]`` / ``.lora_b``
  ``[out, rank]``, with the converter's llama q/k row permutation applied to ``lora_b`` (the
  converter runs the model's own ``modify_tensors`` on the pair, which permutes B's rows);
- ``write_mlx_adapter``: what ``mlx_lm.lora`` writes: ``adapter_config.json`` (its training
  arguments, ``lora_parameters`` with ``rank`` / ``scale`` / ``dropout``) and ``adapters.safetensors``
  holding ``<module path>.lora_a`` ``[in, rank]`` / ``.lora_b`` ``[rank, out]``.

Both return the factors in Hugging Face row order (``{module path: (A [rank, in], B [out, rank])}``),
from which a test computes the merged weights ``W + s * f * B @ A`` on its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from tiny_gguf import LAYER_NAMES, llama_permute

# the PEFT target modules a llama LoRA usually adapts
ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
EVERY_LINEAR = (*ATTENTION, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _shapes(config: dict) -> dict[str, tuple[int, int]]:
    hidden, ff = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    return {"self_attn.q_proj": (config["num_attention_heads"] * head_dim, hidden), "self_attn.k_proj": (kv, hidden),
            "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, config["num_attention_heads"] * head_dim),
            "mlp.gate_proj": (ff, hidden), "mlp.up_proj": (ff, hidden), "mlp.down_proj": (hidden, ff)}


def random_factors(config: dict, modules=ATTENTION, *, rank: int = 4, seed: int = 0, magnitude: float = 0.3,
                   layers=None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded factors (Hugging Face row order) for ``modules`` of ``layers`` (default: every layer),
    large enough that the adapter changes a tiny model's greedy tokens."""
    rng = np.random.default_rng(seed)
    shapes = _shapes(config)
    out = {}
    for layer in range(config["num_hidden_layers"]) if layers is None else layers:
        for module in modules:
            n_out, n_in = shapes[module]
            a = rng.standard_normal((rank, n_in)).astype(np.float32) * magnitude
            b = rng.standard_normal((n_out, rank)).astype(np.float32) * magnitude
            out[f"model.layers.{layer}.{module}"] = (a, b)
    return out


def write_gguf_adapter(hf_dir: Path, out: Path, factors: dict, *, alpha: float = 8.0, arch: str = "llama",
                       dtype: Q = Q.F32, metadata: dict | None = None) -> Path:
    """``factors`` (``random_factors``) as convert_lora_to_gguf writes them for the model in ``hf_dir``."""
    config = json.loads((hf_dir / "config.json").read_text())
    writer = GGUFWriter(str(out), arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    writer.add_string("general.name", "tiny-lora")
    for key, value in (metadata or {}).items():
        writer.add_string(key, value)
    np_dtype = np.float16 if dtype == Q.F16 else np.float32
    for path, (a, b) in factors.items():
        if path == "lm_head":
            name, module = "output.weight", path
        else:
            _, _, layer, module = path.split(".", 3)
            name = f"blk.{layer}.{LAYER_NAMES[module]}.weight"
        if arch == "llama" and module == "self_attn.q_proj":
            b = llama_permute(b, config["num_attention_heads"])
        elif arch == "llama" and module == "self_attn.k_proj":
            b = llama_permute(b, config["num_key_value_heads"])
        writer.add_tensor(name + ".lora_a", np.ascontiguousarray(a.astype(np_dtype)))
        writer.add_tensor(name + ".lora_b", np.ascontiguousarray(b.astype(np_dtype)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_mlx_adapter(out: Path, factors: dict, *, scale: float = 2.0, fine_tune_type: str = "lora",
                      extra: dict | None = None) -> Path:
    """``factors`` as mlx_lm.lora saves a LoRA run (its config holds every training argument; the
    ones an adapter is read with are ``fine_tune_type``, ``num_layers`` and ``lora_parameters``)."""
    out.mkdir(parents=True, exist_ok=True)
    rank = next(iter(factors.values()))[0].shape[0]
    layers = {int(p.split(".")[2]) for p in factors if p.startswith("model.layers.")}
    # mlx-lm adapts the last num_layers layers' modules named in keys (relative to a layer) and the
    # model's modules named in keys by their full path (the head)
    keys = sorted({p.split(".", 3)[3] if p.startswith("model.layers.") else p for p in factors})
    config = {"model": "tiny", "train": True, "fine_tune_type": fine_tune_type, "optimizer": "adam",
              "data": "data", "seed": 0, "num_layers": len(layers), "batch_size": 4, "iters": 10,
              "learning_rate": 1e-5, "adapter_path": str(out), "max_seq_length": 2048,
              "lora_parameters": {"rank": rank, "dropout": 0.0, "scale": scale, "keys": keys}}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=4))
    weights = {}
    for path, (a, b) in factors.items():
        weights[f"{path}.lora_a"] = mx.array(np.ascontiguousarray(a.T))
        weights[f"{path}.lora_b"] = mx.array(np.ascontiguousarray(b.T))
    weights.update(extra or {})
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    return out


def head_factors(config: dict, *, rank: int = 2, seed: int = 0, magnitude: float = 0.3) -> dict:
    """Factors for the output head (``lm_head``; GGUF ``output.weight``)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rank, config["hidden_size"])).astype(np.float32) * magnitude
    b = rng.standard_normal((config["vocab_size"], rank)).astype(np.float32) * magnitude
    return {"lm_head": (a, b)}


def merged_weights(hf_dir: Path, adapters: list[tuple[dict, float]]) -> dict[str, mx.array]:
    """The checkpoint's weights with each adapter merged in: ``W + f * B @ A`` for every
    (factors, f) given (``f``: the whole factor: scale * alpha / rank, or scale * mlx-lm's scale)."""
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(hf_dir / "model.safetensors")).items()}
    for factors, f in adapters:
        for path, (a, b) in factors.items():
            weights[path + ".weight"] = weights[path + ".weight"] + f * (b.astype(np.float64) @ a).astype(np.float32)
    return {k: mx.array(v) for k, v in weights.items()}
