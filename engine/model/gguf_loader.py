"""Load a llama.cpp GGUF file as an mlx-lm model: the file a llama-server user passes with ``-m``.

Steps, top to bottom in ``load_gguf``: parse the header (``gguf_file``), map metadata to an
mlx-lm config (``gguf_config``), rebuild the tokenizer (``gguf_tokenizer``), convert tensors
(``gguf_tensors``: undo the llama q/k row permutation, keep Q4_0/Q4_1/Q8_0 quantized on a GPU,
keep every quantized matrix packed on a CPU with mlxcel's kernels, dequantize everything else to
the compute dtype), then build mlx-lm's model class, quantize (or swap in packed modules for) the
modules whose weights arrived quantized, and load the weights strictly.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import Llama3RoPE

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.config import ARCHITECTURES, architecture, model_config
from mlxcel.engine.gguf.file import GGUFFile, read_gguf
from mlxcel.engine.gguf.tensors import (
    NON_PARAMETER_TENSORS,
    QuantizedWeight,
    dequantize_numpy,
    hf_name,
    llama_qk_rows,
    packable,
    permute_rows,
    to_mlx,
    to_packed,
)
from mlxcel.engine.gguf.tokenizer import build_tokenizer
from mlxcel.engine.model.encoder_only import refuse_encoder_only
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.platform import device
from mlxcel.engine.platform.packed_modules import install_packed
from mlxcel.engine.platform.qmatmul import PackedWeight

log = logging.getLogger(__name__)

# a rank (classifier) head's tensors (cls.weight, cls.bias, cls.output.weight, ...): not part of the
# mlx-lm model; kept in LoadedModel.metadata["classifier_tensors"] for engine.embedding.rank_head
CLASSIFIER = "cls."


def load_gguf(path: str | Path) -> LoadedModel:
    """A ready-to-run model from a GGUF file. Raises ``ModelLoadError`` (or its subclass
    ``UnsupportedQuantError``) with one clear message for anything it cannot read."""
    path = Path(path)
    try:
        return _load(path)
    except ModelLoadError:
        raise
    except Exception as exc:  # a malformed file can trip numpy/mlx/tokenizers in many ways
        raise ModelLoadError(f"could not load GGUF {path}: {type(exc).__name__}: {exc}") from exc


def _load(path: Path) -> LoadedModel:
    gguf_file = read_gguf(path)
    meta = gguf_file.metadata
    refuse_encoder_only(meta.get("general.architecture"), str(path), gguf=True)
    arch, spec = architecture(meta, str(path))
    tokenizer, ids = build_tokenizer(meta, str(path))
    vocab_size = _vocab_size(gguf_file)
    config = model_config(meta, set(gguf_file.tensors), vocab_size, str(path))
    config.update(bos_token_id=ids.bos, eos_token_id=ids.eos)

    weights = convert_weights(gguf_file, config, permute_qk=spec.permuted_qk)
    model = build_model(config, weights, str(path))
    if "rope_freqs.weight" in gguf_file.tensors:
        apply_rope_freqs(model, gguf_file, config)

    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        path=path,
        source="gguf",
        name=str(meta.get("general.name") or path.name),
        chat_template=meta.get("tokenizer.chat_template"),
        metadata={
            "add_bos": ids.add_bos,
            "add_eos": ids.add_eos,
            "architecture": arch,
            "file_type": meta.get("general.file_type"),
            "tensor_types": _type_counts(gguf_file),
            "tokenizer_pre": meta.get("tokenizer.ggml.pre"),
            # what embeddings, rerank and infill read: special-token ids (the FIM roles among them),
            # the pooling the converter chose, the rerank prompt, and the classifier head's tensors
            "token_ids": {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.") and k.endswith("_id")},
            "pooling_type": meta.get(f"{arch}.pooling_type"),
            "rerank_template": meta.get("tokenizer.chat_template.rerank"),
            "add_sep": bool(meta.get("tokenizer.ggml.add_sep_token", False)),
            "classifier_tensors": {name: to_mlx(info, keep_quantized=False, dtype=device.compute_dtype())
                                   for name, info in gguf_file.tensors.items() if name.startswith(CLASSIFIER)},
        },
    )


def _vocab_size(gguf_file: GGUFFile) -> int:
    embd = gguf_file.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelLoadError(f"{gguf_file.path} has no token_embd.weight tensor")
    return int(embd.shape[0])


def _type_counts(gguf_file: GGUFFile) -> dict[str, int]:
    counts: dict[str, int] = {}
    for info in gguf_file.tensors.values():
        counts[info.type_name] = counts.get(info.type_name, 0) + 1
    return counts


def convert_weights(gguf_file: GGUFFile, config: dict, *,
                    permute_qk: bool) -> dict[str, mx.array | QuantizedWeight | PackedWeight]:
    """Every model tensor under its mlx-lm name, in the device's representation."""
    keep = device.keep_quantized_weights()
    pack = device.cpu_kernels()
    repacked: dict[str, int] = {}
    dtype = device.compute_dtype()
    q_rows = llama_qk_rows(config["num_attention_heads"] * config["head_dim"], config["num_attention_heads"])
    k_rows = llama_qk_rows(config["num_key_value_heads"] * config["head_dim"], config["num_key_value_heads"])
    out: dict[str, mx.array | QuantizedWeight] = {}
    for name, info in gguf_file.tensors.items():
        if name in NON_PARAMETER_TENSORS or name.startswith(CLASSIFIER):
            continue
        target = hf_name(name)
        if target is None:
            raise ModelLoadError(f"{gguf_file.path}: unexpected tensor {name!r} for architecture "
                                 f"{gguf_file.architecture!r}")
        if permute_qk and ".attn_q." in name:
            info = permute_rows(info, q_rows)
        elif permute_qk and ".attn_k." in name:
            info = permute_rows(info, k_rows)
        if pack and name.endswith(".weight") and packable(info):
            out[target], changed = to_packed(info)
            if changed:
                repacked[info.type_name] = repacked.get(info.type_name, 0) + 1
        else:
            out[target] = to_mlx(info, keep_quantized=keep and name.endswith(".weight"), dtype=dtype)
    if repacked:
        log.info("%s: the CPU kernels do not run %s as stored; re-packed to Q8_0 (dequantized and quantized "
                 "again to 8 bits per block of 32, not bit-exact)", gguf_file.path.name,
                 ", ".join(f"{n} {t} tensor{'s' if n > 1 else ''}" for t, n in sorted(repacked.items())))
    return out


def build_model(config: dict, weights: dict[str, mx.array | QuantizedWeight | PackedWeight], source: str) -> nn.Module:
    """mlx-lm's model class for ``config`` holding ``weights`` (quantized modules where the
    weights are ``QuantizedWeight``, packed ones where they are ``PackedWeight``)."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    packed = {name[: -len(".weight")]: w for name, w in weights.items() if isinstance(w, PackedWeight)}
    if packed:
        install_packed(model, packed)
    quantized = {name[: -len(".weight")]: w for name, w in weights.items() if isinstance(w, QuantizedWeight)}
    if quantized:
        nn.quantize(
            model,
            class_predicate=lambda p, m: (
                {"group_size": quantized[p].group_size, "bits": quantized[p].bits, "mode": "affine"}
                if p in quantized else False
            ),
        )
    flat: list[tuple[str, mx.array]] = []
    for name, w in weights.items():
        if isinstance(w, QuantizedWeight):
            stem = name[: -len(".weight")]
            flat += [(name, w.weight), (f"{stem}.scales", w.scales), (f"{stem}.biases", w.biases)]
        elif isinstance(w, PackedWeight):
            flat.append((f"{name[: -len('.weight')]}.packed", w.packed))
        else:
            flat.append((name, w))
    try:
        model.load_weights(flat, strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"{source}: tensors do not match the {config['model_type']} model: {exc}") from exc
    mx.eval(model.parameters())
    return model


def apply_rope_freqs(model: nn.Module, gguf_file: GGUFFile, config: dict) -> None:
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
        rope = layer.self_attn.rope
        if not isinstance(rope, Llama3RoPE):
            raise ModelLoadError(f"{gguf_file.path}: rope_freqs present but {config['model_type']} does not use llama3 RoPE")
        rope._freqs = base * factors


__all__ = ["load_gguf", "ARCHITECTURES"]
