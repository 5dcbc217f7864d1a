"""Gemma 3: a SigLIP tower on a fixed square (896 x 896 in the released sizes), its patches pooled to
``mm_tokens_per_image`` (256) and projected by Gemma's soft-embedding projector. llama.cpp writes
``<start_of_image>`` and ``<end_of_image>`` around the embeddings and decodes them non-causally (an
image's tokens see each other both ways, as the model was trained), with sequential positions."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from mlxcel.engine.vision.families.base import Family, ImageSettings, Markers, VisionModules
from mlxcel.engine.vision.prepared import PreparedImage
from mlxcel.engine.vision.resize import BILINEAR, fixed_size

SIGLIP_NORM = (0.5, 0.5, 0.5)
DEFAULT_MERGE = 4  # llama.cpp: patches per side pooled by 4 unless the file says otherwise


class Gemma3(Family):
    def __init__(self):
        super().__init__(name="gemma3", label="Gemma 3", bidirectional=True,
                         markers=Markers("<start_of_image>", "<end_of_image>", "<image_soft_token>"))

    def build(self, vision: dict, text_hidden: int, settings: ImageSettings) -> nn.Module:
        module = importlib.import_module("mlx_vlm.models.gemma3")  # noqa: PLC0415 - mlx-vlm, loaded for vision only
        vision_config = module.VisionConfig.from_dict(vision)
        text = SimpleNamespace(hidden_size=text_hidden, mm_tokens_per_image=settings.tokens)
        projector = module.gemma3.Gemma3MultiModalProjector(SimpleNamespace(vision_config=vision_config,
                                                                             text_config=text))
        return VisionModules(module.VisionModel(vision_config), projector)

    def settings_from_dir(self, config: dict, preprocessor: dict) -> ImageSettings:
        vision = config["vision_config"]
        tokens = int(config.get("mm_tokens_per_image") or config.get("text_config", {}).get("mm_tokens_per_image", 256))
        return ImageSettings(mean=tuple(preprocessor.get("image_mean", SIGLIP_NORM)),
                             std=tuple(preprocessor.get("image_std", SIGLIP_NORM)),
                             patch_size=int(vision["patch_size"]), image_size=int(vision.get("image_size", 224)),
                             tokens=tokens)

    def vision_from_mmproj(self, mmproj) -> tuple[dict, ImageSettings]:
        size, patch = mmproj.int("image_size"), mmproj.int("patch_size")
        merge = int(mmproj.hparams.get("projector.scale_factor") or DEFAULT_MERGE)
        vision = {"model_type": "siglip_vision_model", "hidden_size": mmproj.int("embedding_length"),
                  "intermediate_size": mmproj.int("feed_forward_length"),
                  "num_hidden_layers": mmproj.int("block_count"),
                  "num_attention_heads": mmproj.int("attention.head_count"), "patch_size": patch, "image_size": size,
                  "layer_norm_eps": float(mmproj.hparams.get("attention.layer_norm_epsilon", 1e-6))}
        side = size // patch // merge
        settings = ImageSettings(mean=tuple(mmproj.floats("image_mean")), std=tuple(mmproj.floats("image_std")),
                                 patch_size=patch, image_size=size, merge=merge, tokens=side * side)
        return vision, settings

    def prepare(self, image: Image.Image, settings: ImageSettings, digest: str) -> PreparedImage:
        pixels = fixed_size(image, settings.image_size, list(settings.mean), list(settings.std), BILINEAR)
        side = int(round(settings.tokens ** 0.5))
        return PreparedImage(pixels=pixels[None], grid=(1, side, side), digest=digest)

    def encode(self, modules: nn.Module, image: PreparedImage, dtype: mx.Dtype) -> mx.array:
        hidden, _, _ = modules.vision_tower(mx.array(image.pixels).astype(dtype), output_hidden_states=False)
        return modules.multi_modal_projector(hidden)[0]
