"""Load a llama.cpp GGUF file as an mlx-lm model: the file a llama-server user passes with ``-m``.

Steps, top to bottom in ``load_gguf``: parse the header (``gguf.file``), pick the architecture
and map its metadata to an mlx-lm config (``gguf.config``, ``gguf.architectures``), rebuild the
tokenizer (``gguf.tokenizer``), plan every parameter's source tensors (``gguf.weight_plan``),
convert them (``gguf.tensors``: every quantized matrix kept as MLX's quantized weights on the
MLX-native path (``gguf.mlx_quant``) or packed on a CPU with mlxcel's kernels, everything else
dequantized to the compute dtype; the architecture's row orders and value changes applied on the
way), then build mlx-lm's model class, quantize (or swap in packed modules for) the modules whose
weights arrived quantized, and load the weights strictly.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.architectures import ARCHITECTURES, Conversion, TensorIndex
from mlxcel.engine.gguf.config import architecture, model_config
from mlxcel.engine.gguf.file import GGUFFile, read_gguf
from mlxcel.engine.gguf.heap_trim import release_free_heap
from mlxcel.engine.gguf.metadata import ArchMetadata
from mlxcel.engine.gguf.mlx_quant import QuantizedWeight
from mlxcel.engine.gguf.tensors import (
    concat_rows,
    dequantize_numpy,
    packable,
    permute_rows,
    to_mlx,
    to_packed,
)
from mlxcel.engine.gguf.tokenizer import build_tokenizer
from mlxcel.engine.gguf.weight_plan import plan_weights
from mlxcel.engine.model.encoder.loader import load_encoder_gguf
from mlxcel.engine.model.encoder_only import is_served_encoder, refuse_encoder_only
from mlxcel.engine.model.load_progress import tracked
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
    if is_served_encoder(meta.get("general.architecture")):  # BERT-family: mlxcel's own encoder
        return load_encoder_gguf(path, gguf_file)
    refuse_encoder_only(meta.get("general.architecture"), str(path), gguf=True)
    arch, spec = architecture(meta, str(path))
    tokenizer, ids = build_tokenizer(meta, str(path))
    tensors = TensorIndex({name: info.shape for name, info in gguf_file.tensors.items()},
                          reader=lambda name: dequantize_numpy(gguf_file.tensors[name]))
    config = model_config(meta, tensors, _vocab_size(gguf_file), str(path))
    config.update(bos_token_id=ids.bos, eos_token_id=ids.eos)

    plan = plan_weights(spec, config, ArchMetadata(meta, arch, str(path)), tensors)
    weights = convert_weights(gguf_file, plan)
    model = build_model(config, weights, str(path), prepare=spec.prepare)
    spec.finish(model, gguf_file, config)
    release_free_heap()  # the conversion's scratch, left in the C heap
    resident = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    log.info("%s: %s (%s) weights resident: %.1f MiB", path.name, arch, config["model_type"], resident / 2**20)

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
            "weight_bytes": resident,
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


def convert_weights(gguf_file: GGUFFile,
                    plan: dict[str, Conversion]) -> dict[str, mx.array | QuantizedWeight | PackedWeight]:
    """Every parameter of ``plan`` from its GGUF tensor(s), in the device's representation.

    A parameter taken from one tensor as stored (rows reordered at most) keeps the device's
    choice of representation; one that needs arithmetic (``Conversion.value``) is computed
    in float32 and cast."""
    keep = device.keep_quantized_weights()
    pack = device.cpu_kernels()
    repacked: dict[str, int] = {}
    dtype = device.compute_dtype()
    out: dict[str, mx.array | QuantizedWeight | PackedWeight] = {}
    for name, conv in tracked(list(plan.items()), Path(gguf_file.path)):  # the log's progress line
        infos = [gguf_file.tensors[source] for source in conv.sources]
        if conv.rows is not None:
            infos = [permute_rows(concat_rows(infos), conv.rows)]
        if conv.value is None and len(infos) == 1 and pack and name.endswith(".weight") and packable(infos[0]):
            w, changed = to_packed(infos[0])
            if changed:
                repacked[infos[0].type_name] = repacked.get(infos[0].type_name, 0) + 1
        elif conv.value is None and len(infos) == 1:
            w = to_mlx(infos[0], keep_quantized=keep and name.endswith(".weight"), dtype=dtype)
        else:
            arrays = [to_mlx(info, keep_quantized=False, dtype=mx.float32) for info in infos]
            w = (conv.value(*arrays) if conv.value is not None else arrays[0]).astype(dtype)
        if isinstance(w, QuantizedWeight) and conv.shape is not None and w.shape != conv.shape:
            w = w.dequantize(dtype)  # packed codes cannot be reshaped: take the floats
        if isinstance(w, mx.array) and conv.shape is not None and tuple(w.shape) != conv.shape:
            w = _unit_axes_reshaped(w, conv.shape, name, gguf_file.path)
        out[name] = w
    if repacked:
        log.info("%s: the CPU kernels do not run %s as stored; re-packed to Q8_0 (dequantized and quantized "
                 "again to 8 bits per block of 32, not bit-exact)", gguf_file.path.name,
                 ", ".join(f"{n} {t} tensor{'s' if n > 1 else ''}" for t, n in sorted(repacked.items())))
    return out


def _unit_axes_reshaped(w: mx.array, shape: tuple[int, ...], name: str, path: Path) -> mx.array:
    """``w`` in mlx-lm's shape when the two differ only by axes of size one (the converter
    squeezes a convolution kernel's channel axis, a gate vector's leading 1)."""
    if [d for d in w.shape if d != 1] != [d for d in shape if d != 1]:
        raise ModelLoadError(f"{path}: tensor for {name} has shape {tuple(w.shape)}, mlx-lm expects {shape}")
    return w.reshape(shape)


def build_model(config: dict, weights: dict[str, mx.array | QuantizedWeight | PackedWeight], source: str,
                prepare: Callable[[nn.Module, dict], None] | None = None) -> nn.Module:
    """mlx-lm's model class for ``config`` holding ``weights`` (quantized modules where the
    weights are ``QuantizedWeight``, packed ones where they are ``PackedWeight``); ``prepare``
    adjusts the model to the weights first."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    if prepare is not None:
        prepare(model, weights)
    packed = {name[: -len(".weight")]: w for name, w in weights.items() if isinstance(w, PackedWeight)}
    if packed:
        install_packed(model, packed)
    quantized = _quantizable(model, weights)
    if quantized:
        nn.quantize(
            model,
            class_predicate=lambda p, m: (
                {"group_size": quantized[p].group_size, "bits": quantized[p].bits, "mode": quantized[p].mode}
                if p in quantized else False
            ),
        )
    flat: list[tuple[str, mx.array]] = []
    for name, w in weights.items():
        if isinstance(w, QuantizedWeight):
            stem = name[: -len(".weight")]
            flat += [(name, w.weight), (f"{stem}.scales", w.scales)]
            flat += [] if w.biases is None else [(f"{stem}.biases", w.biases)]
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


def _quantizable(model: nn.Module, weights: dict) -> dict[str, QuantizedWeight]:
    """The quantized weights by module path, once each one's module can hold it (has
    ``to_quantized``: Linear, Embedding, mlx-lm's SwitchLinear); any other one is dequantized in
    ``weights`` to the compute dtype."""
    modules = dict(model.named_modules())
    out: dict[str, QuantizedWeight] = {}
    for name, w in list(weights.items()):
        if not isinstance(w, QuantizedWeight):
            continue
        stem = name[: -len(".weight")]
        module = modules.get(stem)
        if module is not None and hasattr(module, "to_quantized"):
            out[stem] = w
        else:
            weights[name] = w.dequantize(device.compute_dtype())
    return out


__all__ = ["load_gguf", "ARCHITECTURES"]
