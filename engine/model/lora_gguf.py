"""A GGUF LoRA adapter (as llama.cpp's ``convert_lora_to_gguf.py`` writes it) read onto a loaded
model's layers.

The file: ``general.type`` ``adapter``, ``general.architecture`` the base model's, ``adapter.type``
``lora``, ``adapter.lora.alpha`` (0 or absent: no ``alpha / rank`` factor, as llama.cpp), and per
adapted matrix ``<base tensor>.lora_a`` ``[rank, in]`` and ``.lora_b`` ``[out, rank]`` (numpy order),
named as the base tensor (``blk.N.attn_q.weight``). The converter runs the base model's own tensor
changes on the factor pairs, which only ever reorder or select rows of ``B`` (llama's q/k
permutation), so each layer's ``B`` is taken through the same row order the GGUF loader takes the
base weight through (``Architecture.conversion``, asked with the factor pairs standing in for the base
tensors), and ``A`` as it is. Norm vectors that merge tools add (``*_norm.weight``) are skipped as
llama.cpp skips them; anything else is refused with llama.cpp's reasons.
"""

from __future__ import annotations

from pathlib import Path

import mlx.nn as nn
import numpy as np

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.architectures import ARCHITECTURES, TensorIndex
from mlxcel.engine.gguf.file import GGUFFile, read_gguf
from mlxcel.engine.gguf.metadata import ArchMetadata
from mlxcel.engine.gguf.names import gguf_name
from mlxcel.engine.gguf.tensors import dequantize_numpy
from mlxcel.engine.model.lora_linear import Factors
from mlxcel.engine.model.lora_set import AdapterInfo
from mlxcel.engine.model.lora_targets import Target, check_factors, module_kinds, refuse_kind

_SUFFIXES = (".lora_a", ".lora_b")


def read_gguf_adapter(path: Path, index: int, model: nn.Module, config: dict, base_arch: str | None,
                      targets: dict[str, Target]) -> tuple[dict[str, Factors], AdapterInfo]:
    """Adapter ``index`` from the GGUF at ``path``: its factors by module path, and its description."""
    f = read_gguf(path)
    meta = f.metadata
    arch = _check_header(path, meta, config, base_arch)
    pairs = _pairs(path, f)
    alpha = float(meta.get("adapter.lora.alpha", 0.0) or 0.0)
    n_blocks = int(config.get("num_hidden_layers") or len(getattr(model, "layers", [])))
    placed = _place(path, arch, pairs, config, n_blocks, targets)
    unused = sorted(set(pairs) - {source for source, _ in placed.values()})
    if unused:
        raise _not_placed(path, arch, unused[0], model, n_blocks)
    factors = {}
    for module_path, (source, rows) in placed.items():
        a = dequantize_numpy(pairs[source][0]).reshape(pairs[source][0].shape)
        b = dequantize_numpy(pairs[source][1]).reshape(pairs[source][1].shape)
        if rows is not None:
            b = np.take(b, rows, axis=0)
        check_factors(str(path), source, targets[module_path], a, b)
        rank = b.shape[1]
        factors[module_path] = Factors(index, a, b, alpha / rank if alpha else 1.0)
    info = AdapterInfo(str(path), str(meta.get("adapter.lora.task_name", "")),
                       str(meta.get("adapter.lora.prompt_prefix", "")))
    return factors, info


def _check_header(path: Path, meta: dict, config: dict, base_arch: str | None) -> str:
    kind = meta.get("general.type", "")
    if kind != "adapter":
        raise ModelLoadError(f"{path} is not a LoRA adapter: general.type is {kind!r}, expected 'adapter'")
    if meta.get("adapter.type", "") != "lora":
        raise ModelLoadError(f"{path}: adapter.type is {meta.get('adapter.type', '')!r}, expected 'lora'")
    if "adapter.alora.invocation_tokens" in meta:
        raise ModelLoadError(f"{path} is an activated LoRA (adapter.alora.invocation_tokens), which mlxcel does "
                             "not support")
    arch = meta.get("general.architecture", "")
    spec = ARCHITECTURES.get(arch)
    same = arch == base_arch if base_arch else spec is not None and spec.model_type == config.get("model_type")
    if spec is None or not same:
        base = base_arch or config.get("model_type")
        raise ModelLoadError(f"{path}: model arch and LoRA arch mismatch (the adapter is for {arch!r}, the model "
                             f"is {base!r})")
    return arch


def _pairs(path: Path, f: GGUFFile) -> dict[str, tuple]:
    """Each base tensor's (lora_a, lora_b) infos."""
    halves: dict[str, dict[str, object]] = {}
    for name, info in f.tensors.items():
        suffix = next((s for s in _SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            if name.endswith("_norm.weight"):
                continue  # as llama.cpp: merge tools add norm vectors; adapters work without them
            raise ModelLoadError(f"{path}: LoRA tensor {name!r} has unexpected suffix")
        halves.setdefault(name[:-len(suffix)], {})[suffix] = info
    pairs = {}
    for base, half in halves.items():
        if len(half) != 2:
            raise ModelLoadError(f"{path}: LoRA tensor pair for {base!r} is missing one component")
        pairs[base] = (half[".lora_a"], half[".lora_b"])
    return pairs


def _place(path: Path, arch: str, pairs: dict[str, tuple], config: dict, n_blocks: int,
           targets: dict[str, Target]) -> dict[str, tuple[str, np.ndarray | None]]:
    """Each adapted layer's (source pair, row order of B), by module path."""
    spec = ARCHITECTURES[arch]
    # the factor pairs stand in for the base tensors: a base weight [out, in] is B [out, r] by A [r, in]
    shapes = {base: (int(b.shape[0]), int(a.shape[-1])) for base, (a, b) in pairs.items()}
    index = TensorIndex(shapes=shapes)
    meta = ArchMetadata({f"{arch}.block_count": n_blocks}, arch, str(path))
    placed = {}
    for module_path in targets:
        try:
            conv = spec.conversion(module_path + ".weight", config, meta, index)
        except (ModelLoadError, KeyError) as exc:
            raise ModelLoadError(f"{path}: cannot place the adapter's tensors on {arch!r} layers: {exc}") from None
        except ValueError:  # a row order that does not fit the stand-in's rows (llama's q/k heads)
            name = spec.gguf_name(module_path + ".weight", config, meta, index) or module_path
            raise ModelLoadError(f"{path}: tensor {name!r} has incorrect shape (hint: maybe wrong base model?)") \
                from None
        if conv is None:
            continue
        if len(conv.sources) != 1 or conv.value is not None:
            raise ModelLoadError(f"{path}: {module_path} is made from {', '.join(conv.sources)} by a conversion "
                                 "mlxcel cannot apply to LoRA factors")
        placed[module_path] = (conv.sources[0], conv.rows)
    return placed


def _not_placed(path: Path, arch: str, tensor: str, model: nn.Module, n_blocks: int) -> ModelLoadError:
    """Why a pair went nowhere: it names a module that cannot be adapted, or nothing in the model."""
    for module_path, kind in module_kinds(model).items():
        if gguf_name(arch, n_blocks, module_path + ".weight") == tensor:
            return refuse_kind(str(path), tensor, module_path, kind)
    return ModelLoadError(f"{path}: LoRA tensor {tensor!r} does not exist in base model (hint: maybe wrong base "
                          "model?)")
