"""Load a vision tower: from an MLX vision checkpoint directory (as mlx-vlm saves one, or the Hugging
Face original), or from an mmproj GGUF (``--mmproj``), and attach it to the text model it serves.

The tower's weights are read on their own (the text model is mlx-lm's, loaded apart), under the
names mlx-vlm's modules give them: a directory's ``vision_tower.*`` / ``multi_modal_projector.*``
tensors (Hugging Face's ``visual.*`` and ``model.*`` prefixes renamed, and mlx-vlm's own
``sanitize`` of the tower run for kernels still in PyTorch's layout; modules a quantized checkpoint
stores quantized are quantized first), or ``gguf.mmproj``'s mapping of a projector file. The weights
load strictly: a tensor missing or left over is an error naming it.
"""

from __future__ import annotations

import glob
import json
import logging
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.mmproj import read_mmproj
from mlxcel.engine.vision.families import family_for
from mlxcel.engine.vision.positions import install, mrope_sections
from mlxcel.engine.vision.tower import VisionTower

log = logging.getLogger(__name__)

_PREFIXES = (("model.vision_tower.", "vision_tower."), ("model.visual.", "vision_tower."), ("visual.", "vision_tower."),
             ("model.multi_modal_projector.", "multi_modal_projector."))
_KEEP = ("vision_tower.", "multi_modal_projector.")


def is_vision_config(config: dict) -> bool:
    """Whether a checkpoint's config.json describes a vision-language model."""
    return isinstance(config.get("vision_config"), dict) and bool(config["vision_config"])


def _dir_weights(path: Path) -> dict[str, mx.array]:
    files = [f for f in sorted(glob.glob(str(path / "*.safetensors"))) if not f.endswith("consolidated.safetensors")]
    weights: dict[str, mx.array] = {}
    for file in files:
        for key, value in mx.load(file).items():
            for old, new in _PREFIXES:
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            if key.startswith(_KEEP):
                weights[key] = value
    if not weights:
        raise ModelLoadError(f"{path}: no vision tower weights (vision_tower.*) in its safetensors")
    return weights


def _load_strict(modules: nn.Module, weights: dict[str, mx.array], config: dict, source: str) -> None:
    quantized = {k[: -len(".scales")] for k in weights if k.endswith(".scales")}
    if quantized:
        q = config.get("quantization") or config.get("quantization_config") or {}
        nn.quantize(modules, group_size=int(q.get("group_size", 64)), bits=int(q.get("bits", 4)),
                    class_predicate=lambda p, m: p in quantized and hasattr(m, "to_quantized"))
    try:
        modules.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"{source}: the vision weights do not match the tower: {exc}") from exc


def load_from_dir(path: Path, config: dict, dtype: mx.Dtype) -> VisionTower:
    """The tower of an MLX / Hugging Face vision checkpoint directory."""
    family = family_for(config.get("model_type"), str(path))
    preprocessor = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        if (path / name).is_file():
            cfg = json.loads((path / name).read_text())
            preprocessor.update(cfg.get("image_processor", cfg))
    settings = family.settings_from_dir(config, preprocessor)
    text = config.get("text_config") or config
    hidden = int(text["hidden_size"])
    modules = family.build(dict(config["vision_config"]), hidden, settings)
    weights = _dir_weights(path)
    tower_sanitize = getattr(modules.vision_tower, "sanitize", None)
    if tower_sanitize is not None:  # mlx-vlm's: PyTorch-layout kernels to MLX's (a no-op on its own saves)
        weights = {**weights, **{f"vision_tower.{k}": v for k, v in tower_sanitize(
            {k[len("vision_tower."):]: v for k, v in weights.items() if k.startswith("vision_tower.")}).items()}}
    weights = {k: v for k, v in weights.items() if "position_ids" not in k}
    _load_strict(modules, weights, config, str(path))
    modules.set_dtype(dtype)
    mx.eval(modules.parameters())
    return VisionTower(family, modules, settings, str(path), dtype, out_dim=hidden)


def load_from_mmproj(path: Path, dtype: mx.Dtype) -> VisionTower:
    """The tower of an mmproj GGUF."""
    mmproj = read_mmproj(path)
    family = family_for(mmproj.family, str(path))
    vision, settings = family.vision_from_mmproj(mmproj)
    hidden = mmproj.int("projection_dim")
    modules = family.build(vision, hidden, settings)
    _load_strict(modules, {k: mx.array(v) for k, v in mmproj.weights.items()}, {}, str(path))
    modules.set_dtype(dtype)
    mx.eval(modules.parameters())
    return VisionTower(family, modules, settings, str(path), dtype, out_dim=hidden)


def attach(tower: VisionTower, model, tokenizer, config: dict) -> None:
    """Bind ``tower`` to the text model it serves: its vocabulary's image tokens, its embedding scale,
    and (an M-RoPE family) its rotary modules taught planned positions."""
    lm = getattr(model, "language_model", model)
    hidden = int(getattr(lm.args, "hidden_size", 0) or (config.get("text_config") or config)["hidden_size"])
    if tower.out_dim and tower.out_dim != hidden:
        raise ModelLoadError(f"{tower.source}: the projector gives {tower.out_dim}-wide embeddings, the text model is "
                             f"{hidden} wide; is the projector for this model?")
    tower.bind(tokenizer, hidden)
    if tower.family.mrope:
        sections = mrope_sections(config)
        if not sections:
            raise ModelLoadError(f"{tower.source}: a {tower.family.label} projector needs a text model with M-RoPE "
                                 "sections (rope_scaling.mrope_section / rope.dimension_sections); this one has none")
        install(model, sections)
    n = sum(v.size for _, v in tree_flatten(tower.modules.parameters()))
    log.info("vision: %s tower from %s (%.1fM parameters)", tower.family.label, tower.source, n / 1e6)
