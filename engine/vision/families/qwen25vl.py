"""Qwen2.5-VL: a ViT on the image at (about) its own size and shape, in 14-pixel patches (two frames of
a still image, as its 3-D patch kernel takes them), windowed attention but in every ``n_wa_pattern``-th
block, 2 x 2 patches merged into one token by the merger. llama.cpp writes ``<|vision_start|>`` and
``<|vision_end|>`` around the embeddings; the text model places an image's tokens on a (time, row,
column) grid (M-RoPE, ``mrope_section`` of its rotary frequencies per axis), and the text after it
one past the grid's largest side."""

from __future__ import annotations

import importlib

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from PIL import Image

from mlxcel.engine.vision.families.base import Family, ImageSettings, Markers, VisionModules
from mlxcel.engine.vision.prepared import PreparedImage
from mlxcel.engine.vision.resize import BICUBIC, kept_ratio_size, normalized

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# llama.cpp's limits for this family's images, in tokens (``set_limit_image_tokens(8, 4096)``)
MMPROJ_MIN_TOKENS, MMPROJ_MAX_TOKENS = 8, 4096
DEFAULT_WINDOW = 112  # llama.cpp's attention window (pixels) when the file does not give one


class Qwen25VL(Family):
    def __init__(self):
        super().__init__(name="qwen2_5_vl", label="Qwen2.5-VL", mrope=True,
                         markers=Markers("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"))

    def build(self, vision: dict, text_hidden: int, settings: ImageSettings) -> nn.Module:
        module = importlib.import_module("mlx_vlm.models.qwen2_5_vl")  # noqa: PLC0415 - mlx-vlm, loaded for vision only
        return VisionModules(module.VisionModel(module.VisionConfig.from_dict({**vision, "out_hidden_size": text_hidden})))

    def settings_from_dir(self, config: dict, preprocessor: dict) -> ImageSettings:
        vision = config["vision_config"]
        patch = int(preprocessor.get("patch_size") or vision.get("patch_size", 14))
        merge = int(preprocessor.get("merge_size") or vision.get("spatial_merge_size", 2))
        size = preprocessor.get("size") or {}
        return ImageSettings(mean=tuple(preprocessor.get("image_mean", CLIP_MEAN)),
                             std=tuple(preprocessor.get("image_std", CLIP_STD)), patch_size=patch, merge=merge,
                             min_pixels=int(preprocessor.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
                             max_pixels=int(preprocessor.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
                             temporal_patch=int(preprocessor.get("temporal_patch_size")
                                                or vision.get("temporal_patch_size", 2)))

    def vision_from_mmproj(self, mmproj) -> tuple[dict, ImageSettings]:
        depth, patch = mmproj.int("block_count"), mmproj.int("patch_size")
        merge = int(mmproj.hparams.get("spatial_merge_size") or 2)
        pattern = mmproj.int("n_wa_pattern", 0)
        full = [i for i in range(depth) if pattern and (i + 1) % pattern == 0] if pattern else list(range(depth))
        vision = {"model_type": "qwen2_5_vl", "depth": depth, "hidden_size": mmproj.int("embedding_length"),
                  "intermediate_size": mmproj.int("feed_forward_length"), "num_heads": mmproj.int("attention.head_count"),
                  "patch_size": patch, "spatial_patch_size": patch, "spatial_merge_size": merge,
                  "temporal_patch_size": 2, "window_size": int(mmproj.hparams.get("window_size") or DEFAULT_WINDOW),
                  "fullatt_block_indexes": full}
        area = (patch * merge) ** 2
        settings = ImageSettings(mean=tuple(mmproj.floats("image_mean")), std=tuple(mmproj.floats("image_std")),
                                 patch_size=patch, merge=merge, min_pixels=MMPROJ_MIN_TOKENS * area,
                                 max_pixels=MMPROJ_MAX_TOKENS * area, temporal_patch=2)
        return vision, settings

    def prepare(self, image: Image.Image, settings: ImageSettings, digest: str) -> PreparedImage:
        patch, merge, frames = settings.patch_size, settings.merge, settings.temporal_patch
        height, width = kept_ratio_size(image.height, image.width, patch * merge, settings.min_pixels,
                                        settings.max_pixels)
        pixels = normalized(image.resize((width, height), resample=BICUBIC), list(settings.mean), list(settings.std))
        rows, cols = height // patch, width // patch
        # [frames, C, H, W] -> one row per patch, the merge unit's 2 x 2 patches adjacent (the processor's order)
        x = np.broadcast_to(pixels.transpose(2, 0, 1)[None], (frames, 3, height, width))
        x = x.reshape(1, frames, 3, rows // merge, merge, patch, cols // merge, merge, patch)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(rows * cols, 3 * frames * patch * patch)
        return PreparedImage(pixels=np.ascontiguousarray(x, dtype=np.float32),
                             grid=(1, rows // merge, cols // merge), digest=digest, extra={"grid_thw": (1, rows, cols)})

    def encode(self, modules: nn.Module, image: PreparedImage, dtype: mx.Dtype) -> mx.array:
        grid = mx.array([list(image.extra["grid_thw"])])
        return modules.vision_tower(mx.array(image.pixels).astype(dtype), grid)
