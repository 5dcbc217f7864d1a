"""LoRA adapters attached to a loaded model, as llama-server's ``--lora`` / ``--lora-scaled`` load them.

Each adapter is a GGUF file (``lora_gguf``) or an mlx-lm adapter directory (``lora_mlx``); every
factor pair is checked against the layer it adapts before anything changes (``lora_targets``), so a
wrong base model is refused at load with the tensor and the shapes, and the model is left as it was.
Then each adapted layer gets all its adapters' factors at once (``lora_linear.install``), the blocks
whose layers changed stop running as planned straight-through kernels (``lean_blocks`` is asked
again: it plans only blocks of plain layers), and the model carries the set (``LoadedModel.adapters``)
with its global scales. The scales a forward runs at are each row's (``lora_linear``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.file import MAGIC
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.model.lora_gguf import read_gguf_adapter
from mlxcel.engine.model.lora_linear import Factors, install
from mlxcel.engine.model.lora_mlx import CONFIG, WEIGHTS, is_mlx_adapter, read_mlx_adapter
from mlxcel.engine.model.lora_set import AdapterInfo, AdapterSet
from mlxcel.engine.model.lora_targets import Target, targets
from mlxcel.engine.platform.lean_blocks import lean_blocks

log = logging.getLogger(__name__)


def attach_adapters(loaded: LoadedModel, adapters: Sequence[tuple[str, float]], apply: bool = True) -> AdapterSet:
    """Load ``adapters`` ((path, scale) in command-line order) onto ``loaded`` and set
    ``loaded.adapters``. ``apply`` False (``--lora-init-without-apply``): every global scale starts at
    0, for ``POST /lora-adapters`` to set. Raises ``ModelLoadError`` (the model unchanged) when an
    adapter cannot be read or does not fit the model."""
    if loaded.metadata.get("encoder"):
        raise ModelLoadError("LoRA adapters are not supported on an encoder model (it serves embeddings only)")
    layers = targets(loaded.model)
    per_layer: dict[str, list[Factors]] = {}
    infos = []
    for index, (path, _) in enumerate(adapters):
        factors, info = read_adapter(Path(path).expanduser(), index, loaded, layers)
        infos.append(AdapterInfo(path, info.task_name, info.prompt_prefix))
        if not factors:
            log.warning("LoRA adapter %s changes no layer of this model", path)
        for module_path, f in factors.items():
            per_layer.setdefault(module_path, []).append(f)
    for module_path, factors in per_layer.items():
        install(layers[module_path].module, factors)
    if per_layer:
        lean_blocks(loaded.model)  # blocks with an adapted layer are no longer planned
    scales = tuple(float(scale) if apply else 0.0 for _, scale in adapters)
    loaded.adapters = AdapterSet(infos, scales)
    log.info("LoRA adapters: %s; %d layers adapted", ", ".join(f"{i}: {p} (scale {s:g})" for i, ((p, _), s) in
                                                              enumerate(zip(adapters, scales))), len(per_layer))
    return loaded.adapters


def read_adapter(path: Path, index: int, loaded: LoadedModel,
                 layers: dict[str, Target]) -> tuple[dict[str, Factors], AdapterInfo]:
    """One adapter's factors by module path, whichever layout it is in."""
    if is_mlx_adapter(path):
        return read_mlx_adapter(path, index, loaded.model, layers)
    if path.is_file() and _gguf(path):
        base_arch = loaded.metadata.get("architecture") if loaded.source == "gguf" else None
        return read_gguf_adapter(path, index, loaded.model, loaded.config, base_arch, layers)
    if not path.exists():
        raise ModelLoadError(f"LoRA adapter not found: {path}")
    raise ModelLoadError(f"{path} is neither a GGUF LoRA adapter nor an mlx-lm adapter directory ({CONFIG} and "
                         f"{WEIGHTS})")


def _gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == MAGIC
