"""An image's pixels as a vision tower takes them: resized, scaled to [0, 1], normalised.

Two ways of sizing, as llama.cpp's image preprocessors (``mtmd-image.cpp``) and the Hugging Face
processors the checkpoints ship with both do them:

- a fixed square (SigLIP towers: Gemma 3's 896 x 896), the aspect ratio not kept;
- a size that keeps the aspect ratio, each side a multiple of the tower's patch times its merge
  factor, the area between a minimum and a maximum (Qwen2.5-VL's "smart resize").

Resampling is Pillow's (bilinear or bicubic, as each family's processor names it). Pure numpy and
Pillow; no MLX.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

BILINEAR = Image.Resampling.BILINEAR
BICUBIC = Image.Resampling.BICUBIC


def normalized(image: Image.Image, mean: list[float], std: list[float]) -> np.ndarray:
    """``[H, W, 3]`` float32: the pixels over 255, less ``mean``, over ``std`` (per channel)."""
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    return (pixels - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)


def fixed_size(image: Image.Image, side: int, mean: list[float], std: list[float],
               resample: Image.Resampling = BILINEAR) -> np.ndarray:
    """The image stretched to ``side`` x ``side``, normalised: ``[side, side, 3]``."""
    return normalized(image.resize((side, side), resample=resample), mean, std)


def kept_ratio_size(height: int, width: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) near the image's, each a multiple of ``align``, the area within
    [``min_pixels``, ``max_pixels``] (rounded first, then scaled down or up as a whole)."""
    h = max(align, round(height / align) * align)
    w = max(align, round(width / align) * align)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(align, math.floor(height / beta / align) * align)
        w = max(align, math.floor(width / beta / align) * align)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / align) * align
        w = math.ceil(width * beta / align) * align
    return h, w
