"""An mlx-lm LoRA adapter directory (as ``mlx_lm.lora`` writes it) read onto a loaded model's layers.

The directory: ``adapter_config.json`` (the training run's settings: ``fine_tune_type``, default
``lora``; ``lora_parameters`` with ``rank`` and ``scale``) and ``adapters.safetensors``, the trainable
parameters of mlx-lm's ``LoRALinear`` layers by their path in mlx-lm's model:
``<module path>.lora_a`` ``[in, rank]`` and ``<module path>.lora_b`` ``[rank, out]``. mlx-lm adds
``scale * (x @ lora_a) @ lora_b`` to the layer's output (``tuner/lora.py``): ``scale`` is the whole
factor, with no ``alpha / rank`` (``tuner/utils.py`` refuses a config that gives ``alpha`` instead).
mlxcel builds mlx-lm's own model classes, for GGUF files too, so the paths are the model's own.
DoRA (``fine_tune_type: dora``, a magnitude vector ``m`` per layer) and full fine-tunes are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.lora_linear import Factors
from mlxcel.engine.model.lora_set import AdapterInfo
from mlxcel.engine.model.lora_targets import Target, check_factors, module_kinds, refuse_kind

CONFIG = "adapter_config.json"
WEIGHTS = "adapters.safetensors"


def is_mlx_adapter(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


def read_mlx_adapter(path: Path, index: int, model: nn.Module,
                     targets: dict[str, Target]) -> tuple[dict[str, Factors], AdapterInfo]:
    """Adapter ``index`` from the mlx-lm directory ``path``: its factors by module path, and its
    description."""
    scale, rank = _lora_parameters(path)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise ModelLoadError(f"{path}: no {WEIGHTS} (an mlx-lm adapter directory holds {CONFIG} and {WEIGHTS})")
    try:
        tensors = mx.load(str(weights))
    except Exception as exc:
        raise ModelLoadError(f"cannot read {weights}: {exc}") from None
    factors = {}
    kinds = module_kinds(model)
    for module_path, (a, b) in _pairs(path, tensors).items():
        target = targets.get(module_path)
        if target is None:
            if module_path in kinds:
                raise refuse_kind(str(path), module_path + ".lora_a", module_path, kinds[module_path])
            raise ModelLoadError(f"{path}: LoRA tensor {module_path + '.lora_a'!r} does not exist in base model "
                                 "(hint: maybe wrong base model?)")
        a_t, b_t = np.array(a.astype(mx.float32)).T, np.array(b.astype(mx.float32)).T
        check_factors(str(path), module_path, target, a_t, b_t)
        if rank is not None and a_t.shape[0] != rank:
            raise ModelLoadError(f"{path}: {module_path} has rank {a_t.shape[0]}, the config says {rank}")
        factors[module_path] = Factors(index, a_t, b_t, scale)
    return factors, AdapterInfo(str(path))


def _lora_parameters(path: Path) -> tuple[float, int | None]:
    """``lora_parameters``' scale and rank, after the checks mlx-lm makes when it loads an adapter."""
    try:
        config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path / CONFIG}: {exc}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path / CONFIG} is not a JSON object")
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        what = "a full fine-tune is a model: load it with -m" if kind == "full" else "only LoRA adapters are supported"
        raise ModelLoadError(f"{path}: fine_tune_type is {kind!r}; {what}")
    params = config.get("lora_parameters")
    if not isinstance(params, dict) or not isinstance(params.get("scale"), (int, float)) \
            or isinstance(params.get("scale"), bool):
        hint = " (mlx-lm's LoRA config uses 'scale', not 'alpha')" if isinstance(params, dict) and "alpha" in params \
            else ""
        raise ModelLoadError(f"{path / CONFIG}: lora_parameters has no numeric 'scale'{hint}")
    rank = params.get("rank")
    return float(params["scale"]), int(rank) if isinstance(rank, int) and not isinstance(rank, bool) else None


def _pairs(path: Path, tensors: dict[str, mx.array]) -> dict[str, tuple[mx.array, mx.array]]:
    """Each module path's (lora_a, lora_b)."""
    halves: dict[str, dict[str, mx.array]] = {}
    for name, value in tensors.items():
        module_path, _, leaf = name.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise ModelLoadError(f"{path}: {name!r} is not a LoRA parameter (lora_a / lora_b); DoRA and full "
                                 "fine-tunes are not supported")
        halves.setdefault(module_path, {})[leaf] = value
    pairs = {}
    for module_path, half in halves.items():
        if len(half) != 2:
            raise ModelLoadError(f"{path}: LoRA tensor pair for {module_path!r} is missing one component")
        pairs[module_path] = (half["lora_a"], half["lora_b"])
    return pairs
