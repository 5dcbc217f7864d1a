"""A loaded vision tower: its family, modules and image settings, bound to the text model's vocabulary.

:meth:`VisionTower.prepare` turns an image's bytes into a :class:`PreparedImage` (any thread: Pillow
and numpy); :meth:`VisionTower.encode` runs the tower and projector on it (the engine thread: MLX),
once per image however many chunks or requests use it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.vision.families import Family, ImageSettings
from mlxcel.engine.vision.image import decode_image
from mlxcel.engine.vision.prepared import PreparedImage


@dataclass(eq=False)
class VisionTower:
    family: Family
    modules: nn.Module
    settings: ImageSettings
    source: str  # the checkpoint directory or mmproj file it came from
    dtype: mx.Dtype = mx.float32
    placeholder_id: int = -1
    embed_scale: float | None = None  # the text model's input scale, which image rows are divided by
    out_dim: int = 0  # the width of the embeddings it gives (the text model's it was made for)

    def bind(self, tokenizer, text_hidden: int) -> None:
        """Take the placeholder's id from the text model's vocabulary (refused when it lacks the
        family's image tokens) and the text model's embedding scale (``text_hidden``: its width)."""
        tok = getattr(tokenizer, "_tokenizer", tokenizer)
        vocab = tok.get_vocab()
        markers = self.family.markers
        missing = [t for t in (markers.placeholder, markers.begin, markers.end) if t not in vocab]
        if missing:
            raise ModelLoadError(f"{self.source}: the text model's vocabulary lacks the {self.family.label} image "
                                 f"tokens {', '.join(missing)}; is the projector for this model?")
        self.placeholder_id = int(vocab[markers.placeholder])
        if self.family.name == "gemma3":
            self.embed_scale = float(text_hidden) ** 0.5

    def limit_tokens(self, least: int | None, most: int | None) -> None:
        self.settings = self.settings.with_token_limits(least, most)

    def prepare(self, data: bytes) -> PreparedImage:
        """``data`` (an encoded image) decoded, sized and laid out for this tower."""
        image = decode_image(data)
        return self.family.prepare(image, self.settings, hashlib.sha256(data).hexdigest())

    def encode(self, image: PreparedImage) -> mx.array:
        """``[n_tokens, hidden]`` embeddings of ``image`` (computed once, kept on it)."""
        if image.embeds is None:
            embeds = self.family.encode(self.modules, image, self.dtype)
            if embeds.shape[0] != image.n_tokens:
                raise ValueError(f"the vision tower gave {embeds.shape[0]} embeddings for an image of {image.n_tokens} "
                                 "positions")
            mx.eval(embeds)
            image.embeds = embeds
        return image.embeds
