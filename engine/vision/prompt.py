"""A prompt with images: a token sequence in which each image holds as many positions as it has
embeddings (each carrying the family's placeholder token), and :class:`PromptMedia`, which says
where the images are and where the text model places every token.

:func:`marked_prompt` builds one from prompt text in which a marker string stands for each image
(llama-server's media marker): the text around the markers tokenized piece by piece, the family's
begin and end text around each image, as llama.cpp's ``mtmd_tokenize`` lays it out.

:meth:`PromptMedia.chunk` gives what one prompt chunk needs to be fed (its images' embeddings, its
positions); :func:`reusable_through` how much of a cached prefix a new prompt may reuse (only what
holds the same images, in the same places, at the same position shift).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.engine.vision.positions import PositionPlan, mrope_positions, shifted
from mlxcel.engine.vision.prepared import PlacedImage, PreparedImage

# What a slot's cache holds of images: every image's (start, length, digest), and the position shift
MediaKey = tuple[tuple[tuple[int, int, str], ...], int]
NO_MEDIA: MediaKey = ((), 0)


@dataclass
class ChunkMedia:
    """One prompt chunk's images (``spans``: chunk-relative offset and image) and the positions its
    tokens take (``plan``; None: at their indices)."""

    tower: Any
    spans: list[tuple[int, PreparedImage]] = field(default_factory=list)
    plan: PositionPlan | None = None


@dataclass
class PromptMedia:
    """Where a prompt's images are (``images``, by start) and, for an M-RoPE family, every token's
    ``positions`` ``[3, L]`` moved by ``shift`` so the prompt ends at its index (``positions.py``)."""

    tower: Any
    images: list[PlacedImage]
    positions: np.ndarray | None = None
    shift: int = 0

    @classmethod
    def build(cls, tower, images: list[PlacedImage], n_tokens: int) -> PromptMedia:
        images = sorted(images, key=lambda p: p.start)
        if not tower.family.mrope:
            return cls(tower, images)
        positions, shift = shifted(mrope_positions(n_tokens, images))
        return cls(tower, images, positions, shift)

    @property
    def key(self) -> MediaKey:
        return tuple(p.key for p in self.images), self.shift

    @property
    def plain_from(self) -> int:
        """The first position from which chunks are plain text at their indices (after the last image)."""
        return self.images[-1].end if self.images else 0

    def chunk_end(self, start: int, end: int) -> int:
        """``end`` moved past any image it would cut (an image is fed whole, in one chunk)."""
        for placed in self.images:
            if placed.start < end < placed.end:
                return placed.end
        return end

    def chunk(self, start: int, end: int) -> ChunkMedia:
        spans = [(p.start - start, p.image) for p in self.images if start <= p.start < end]
        plan = None
        if self.positions is not None:
            if spans:
                plan = PositionPlan(positions=mx.array(self.positions[:, start:end]))
            else:
                plan = PositionPlan(shift=int(self.positions[0, start]) - start)
        return ChunkMedia(self.tower, spans, plan)


class MarkerMismatch(ValueError):
    """The prompt's markers and its images do not pair up."""


def marked_prompt(text: str, marker: str, images: Sequence[PreparedImage], tower,
                  tokenize: Callable[[str], list[int]], prefix: Sequence[int] = ()) -> tuple[list[int], PromptMedia]:
    """``text`` with ``marker`` standing for each of ``images`` (in order), as tokens and media."""
    parts = text.split(marker)
    if len(parts) - 1 != len(images):
        raise MarkerMismatch(f"number of media markers in text ({len(parts) - 1}) does not match number of "
                             f"bitmaps ({len(images)})")
    markers = tower.family.markers
    tokens, placed = list(prefix), []
    for i, part in enumerate(parts):
        if i:
            tokens += tokenize(markers.end)
        tokens += tokenize(part) if part else []
        if i < len(images):
            tokens += tokenize(markers.begin)
            placed.append(PlacedImage(len(tokens), images[i]))
            tokens += [tower.placeholder_id] * images[i].n_tokens
    return tokens, PromptMedia.build(tower, placed, len(tokens))


def reusable_through(cached: MediaKey, mine: MediaKey, n: int) -> int:
    """How much of a common token prefix of length ``n`` a prompt whose images are ``mine`` may reuse from
    a cache that holds ``cached`` (both ``PromptMedia.key``s): none at another position shift, else up to
    the first image (of either) that the other does not hold at the same place with the same bytes, or
    that the prefix ends inside."""
    if mine[1] != cached[1]:
        return 0
    theirs, ours = set(cached[0]), set(mine[0])
    for start, length, digest in sorted(theirs | ours):
        if start >= n:
            break
        key = (start, length, digest)
        if key not in theirs or key not in ours or start + length > n:
            return start
    return n
