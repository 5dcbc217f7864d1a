"""One image of a request, ready for its vision tower, and where it sits in a prompt.

:class:`PreparedImage` is made on the HTTP side (decoded and resized in a worker thread, no MLX):
the tower's input, how many prompt positions its embeddings take and how they are laid out (the
grid M-RoPE positions follow), and the digest of the bytes it came from, which is what a cached
prompt prefix is keyed by (two requests reuse each other's cache only through the same image).
Its embeddings are computed once, on the engine thread, when its prompt is first fed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class PreparedImage:
    """``pixels``: what the family's tower takes; ``grid``: (frames, rows, columns) of its output tokens
    (rows x columns = ``n_tokens`` for a still image); ``digest``: sha256 of the image's bytes."""

    pixels: np.ndarray
    grid: tuple[int, int, int]
    digest: str
    extra: dict[str, Any] = field(default_factory=dict)  # what the tower needs besides the pixels
    embeds: Any = None  # the projected embeddings [n_tokens, hidden] once encoded (engine thread)

    @property
    def n_tokens(self) -> int:
        t, h, w = self.grid
        return t * h * w


@dataclass(frozen=True)
class PlacedImage:
    """An image's embeddings standing in prompt positions ``start`` .. ``start + n_tokens``."""

    start: int
    image: PreparedImage

    @property
    def end(self) -> int:
        return self.start + self.image.n_tokens

    @property
    def key(self) -> tuple[int, int, str]:
        """What a cached prefix is compared by: where the image sits, how long, which bytes."""
        return self.start, self.image.n_tokens, self.image.digest
