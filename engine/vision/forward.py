"""A prompt chunk that holds images (or sits before one) through the text model, on its own cache.

The chunk's input embeddings are the text model's embeddings of its tokens with each image's
positions replaced by the image's projected embeddings (divided by the embedding scale on a model
that scales its inputs, Gemma 3, so the scale it applies leaves them as projected); mlx-lm's text
models take them as ``input_embeddings``. Around the forward:

- each cache is wrapped so the attention mask is an array (:class:`_MaskedCache`): with an image's
  tokens seeing each other both ways on a ``bidirectional`` family, and in any case an array, which
  also steers mlxcel's fused one-function blocks (``platform.lean_blocks``) onto mlx-lm's own forward,
  whose rotary modules take the planned positions;
- the rotary modules place the chunk's tokens by the prompt's :class:`~positions.PositionPlan`.

Only the last position's logits are computed (the head on one row), as for any prompt chunk.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.engine.vision.positions import PositionPlan, positioned
from mlxcel.engine.vision.prompt import ChunkMedia


class _MaskedCache:
    """A layer cache whose ``make_mask`` returns an array mask, with ``blocks`` (chunk-relative
    ``(start, end)`` spans whose tokens attend to each other) opened; everything else is the cache's."""

    def __init__(self, cache: Any, blocks: list[tuple[int, int]]):
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_blocks", blocks)

    def __getattr__(self, name: str):
        return getattr(self._cache, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._cache, name, value)

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        mask = self._cache.make_mask(n, return_array=True, window_size=window_size)
        if mask is None:  # one token: it sees everything before it
            mask = mx.ones((n, int(self._cache.offset) + n), dtype=mx.bool_)
        if not self._blocks:
            return mask
        opened = np.zeros(mask.shape, dtype=bool)
        k = mask.shape[-1]
        for start, end in self._blocks:
            opened[start:end, k - n + start:k - n + end] = True
        return mx.logical_or(mask, mx.array(opened))


def text_model(model):
    """The mlx-lm text model inside ``model`` (a vision checkpoint's wrapper keeps it as ``language_model``)."""
    return getattr(model, "language_model", model)


def chunk_embeddings(model, tokens: mx.array, media: ChunkMedia) -> mx.array:
    """``[1, L, hidden]``: the tokens' embeddings with the images' rows put in."""
    embed = text_model(model).model.embed_tokens
    h = embed(tokens[None])
    if not media.spans:
        return h
    pieces, at = [], 0
    for offset, image in media.spans:
        rows = media.tower.encode(image).astype(h.dtype)
        if media.tower.embed_scale is not None:
            rows = rows / mx.array(media.tower.embed_scale, dtype=mx.bfloat16).astype(h.dtype)
        pieces += [h[:, at:offset], rows[None]]
        at = offset + image.n_tokens
    pieces.append(h[:, at:])
    return mx.concatenate([p for p in pieces if p.shape[1]], axis=1)


def media_logits(model, tokens: mx.array, media: ChunkMedia, cache: list[Any], want: bool) -> mx.array | None:
    """Feed one chunk with images (``media``) to ``cache``; the last position's logits ``[V]`` if ``want``
    (queued, not evaluated)."""
    h = chunk_embeddings(model, tokens, media)
    blocks = [(o, o + image.n_tokens) for o, image in media.spans] if media.tower.family.bidirectional else []
    wrapped = [_MaskedCache(c, blocks) for c in cache]
    lm = text_model(model)
    plan = media.plan
    with positioned(plan if plan is not None and (plan.shift or plan.positions is not None) else None):
        hidden = lm.model(tokens[None], cache=wrapped, input_embeddings=h)
    if not want:
        return None
    last = hidden[:, -1:, :]
    out = lm.lm_head(last) if "lm_head" in lm else lm.model.embed_tokens.as_linear(last)
    return out[0, -1]


__all__ = ["PositionPlan", "media_logits", "chunk_embeddings", "text_model"]
