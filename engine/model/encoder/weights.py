"""A GGUF file's tensors into an :class:`~.network.Encoder`, by their own names, in the device's
representation (the choice ``engine.platform.device`` makes for every model):

- on a CPU with mlxcel's kernels, a quantized matrix of a linear or embedding layer stays in its
  blocks and runs on the kernels (``PackedLinear`` / ``PackedEmbedding``);
- on a GPU, a Q4_0 / Q4_1 / Q8_0 matrix stays quantized in MLX's affine layout;
- everything else (norms, biases, float matrices, other quantized types on a GPU) is dequantized to
  the compute dtype; ``loading.load_model`` then packs the float matrices for the CPU kernels.

The classifier head (``cls.*``) is not part of the encoder; ``classifier_tensors`` hands it to
``engine.embedding.rank_head``.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.file import GGUFFile
from mlxcel.engine.gguf.tensors import QuantizedWeight, packable, to_mlx, to_packed
from mlxcel.engine.platform import device
from mlxcel.engine.platform.packed_modules import install_packed
from mlxcel.engine.platform.qmatmul import PackedWeight

CLASSIFIER = "cls."


def install_weights(model: nn.Module, gguf_file: GGUFFile) -> None:
    """Load every non-classifier tensor of ``gguf_file`` into ``model`` (strict: a tensor without a
    parameter or a parameter without a tensor is a ``ModelLoadError``)."""
    matrices = {path for path, m in model.named_modules() if type(m) in (nn.Linear, nn.Embedding)}
    pack, keep, dtype = device.cpu_kernels(), device.keep_quantized_weights(), device.compute_dtype()
    flat: list[tuple[str, mx.array]] = []
    packed: dict[str, PackedWeight] = {}
    quantized: dict[str, QuantizedWeight] = {}
    for name, info in gguf_file.tensors.items():
        if name.startswith(CLASSIFIER):
            continue
        stem, _, leaf = name.rpartition(".")
        matrix = leaf == "weight" and stem in matrices
        if matrix and pack and packable(info):
            packed[stem] = to_packed(info)[0]
            continue
        w = to_mlx(info, keep_quantized=keep and matrix, dtype=dtype)
        if isinstance(w, QuantizedWeight):
            quantized[stem] = w
        else:
            flat.append((name, w))
    if packed:
        install_packed(model, packed)
        flat += [(f"{stem}.packed", w.packed) for stem, w in packed.items()]
    if quantized:
        nn.quantize(model, class_predicate=lambda p, _m: (
            {"group_size": quantized[p].group_size, "bits": quantized[p].bits, "mode": "affine"}
            if p in quantized else False))
        for stem, w in quantized.items():
            flat += [(f"{stem}.weight", w.weight), (f"{stem}.scales", w.scales), (f"{stem}.biases", w.biases)]
    try:
        model.load_weights(flat, strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"{gguf_file.path}: tensors do not match the {model.spec.arch} encoder: {exc}") from exc
    mx.eval(model.parameters())


def classifier_tensors(gguf_file: GGUFFile) -> dict[str, mx.array]:
    """The rank head's tensors (``cls.weight``, ``cls.output.bias``, ...) as float arrays."""
    return {name: to_mlx(info, keep_quantized=False, dtype=device.compute_dtype())
            for name, info in gguf_file.tensors.items() if name.startswith(CLASSIFIER)}
