"""What one family of vision-language models needs from mlxcel, over mlx-vlm's modules for it.

A :class:`Family` knows, for its checkpoints:

- how its tower and projector are built from a config (mlx-vlm's classes; the config read from an
  MLX checkpoint's ``config.json`` or made from an mmproj file's ``clip.vision.*`` metadata);
- how an image is prepared for it (:meth:`prepare`: size, normalisation, patch layout; numpy only);
- how prepared images become embeddings in the text model's space (:meth:`encode`, engine thread);
- what stands in the prompt for an image (:class:`Markers`: the text before and after it, as
  llama.cpp's ``mtmd`` writes it, and the placeholder token its positions carry);
- how its text model places those positions: in sequence (``mrope`` False), or on a time / row /
  column grid (Qwen's M-RoPE), and whether an image's tokens attend to each other both ways
  (``bidirectional``: Gemma 3, as llama.cpp decodes its images non-causally).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from mlxcel.engine.vision.prepared import PreparedImage


@dataclass(frozen=True)
class Markers:
    """The text llama.cpp puts around an image's embeddings, and the token that holds their places."""

    begin: str
    end: str
    placeholder: str


@dataclass(frozen=True)
class ImageSettings:
    """How images are sized and normalised for one loaded tower."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    patch_size: int
    image_size: int = 0  # a fixed square side (0: the size follows the image)
    merge: int = 1  # patches merged per side into one token
    min_pixels: int = 0
    max_pixels: int = 0
    temporal_patch: int = 1
    tokens: int = 0  # a fixed-size family's tokens per image

    def with_token_limits(self, least: int | None, most: int | None) -> ImageSettings:
        """``--image-min-tokens`` / ``--image-max-tokens`` over the model's own limits (a size that follows
        the image only)."""
        if not self.max_pixels:
            return self
        area = (self.patch_size * self.merge) ** 2
        return replace(self, min_pixels=least * area if least else self.min_pixels,
                       max_pixels=most * area if most else self.max_pixels)


@dataclass
class Family:
    """One family (module docstring). Subclasses fill in the hooks."""

    name: str  # mlx-vlm's model type
    markers: Markers
    mrope: bool = False
    bidirectional: bool = False
    label: str = ""
    sections: tuple[int, ...] = field(default_factory=tuple)

    def build(self, vision: dict, text_hidden: int, settings: ImageSettings) -> nn.Module:
        """The tower and projector modules (parameters named as in an mlx-vlm checkpoint)."""
        raise NotImplementedError

    def settings_from_dir(self, config: dict, preprocessor: dict) -> ImageSettings:
        raise NotImplementedError

    def vision_from_mmproj(self, mmproj) -> tuple[dict, ImageSettings]:
        """The vision config mlx-vlm's classes take, and the image settings, from a projector file."""
        raise NotImplementedError

    def prepare(self, image: Image.Image, settings: ImageSettings, digest: str) -> PreparedImage:
        raise NotImplementedError

    def encode(self, modules: nn.Module, image: PreparedImage, dtype: mx.Dtype) -> mx.array:
        """``[n_tokens, text hidden]`` embeddings of one prepared image."""
        raise NotImplementedError


class VisionModules(nn.Module):
    """The tower and its projector under the names an mlx-vlm checkpoint gives them."""

    def __init__(self, tower: nn.Module, projector: nn.Module | None = None):
        super().__init__()
        self.vision_tower = tower
        if projector is not None:
            self.multi_modal_projector = projector
