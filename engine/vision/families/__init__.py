"""The vision-language families mlxcel serves, by mlx-vlm model type; every other vision checkpoint is
refused by name (:func:`family_for`)."""

from __future__ import annotations

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.vision.families.base import Family, ImageSettings, Markers, VisionModules
from mlxcel.engine.vision.families.gemma3 import Gemma3
from mlxcel.engine.vision.families.qwen25vl import Qwen25VL

FAMILIES: dict[str, Family] = {f.name: f for f in (Gemma3(), Qwen25VL())}


def family_for(model_type: str | None, source: str) -> Family:
    """The family of a checkpoint whose ``model_type`` (or projector's mlx-vlm type) is given."""
    family = FAMILIES.get(model_type or "")
    if family is None:
        served = ", ".join(f"{f.label} ({f.name})" for f in FAMILIES.values())
        raise ModelLoadError(f"{source}: vision model type {model_type!r} is not served by mlxcel; it runs {served}")
    return family


__all__ = ["FAMILIES", "Family", "ImageSettings", "Markers", "VisionModules", "family_for"]
