"""Where a prompt's tokens sit for the text model's rotary embedding, when images are in it.

Gemma 3 places every token, image or text, at its index: nothing to do. Qwen's M-RoPE places an
image's tokens on a grid, (time, row, column) each rotating its own share of the frequencies
(``mrope_section``), from the next free position; the text after the image goes on one past the
grid's largest side, so a prompt with images ends at a position below its length
(:func:`mrope_positions`, as Hugging Face's ``get_rope_index`` and llama.cpp's ``n_pos`` lay it out).

Rotary attention depends only on differences of positions, so a whole sequence may be moved by a
constant. mlxcel moves a prompt so that its last token sits at its index (``shift`` =
length - next position): every token generated after it, and every token of the prompt after its last
image, then sits at its index, which is what every forward in the engine (the ragged batch, the
batch cache, a draft model's verify) assumes; only the prompt's chunks up to its last image need
positions of their own. A slot's cached prefix was computed at one shift and is reusable only at the
same one (part of its cache key).

:func:`install` teaches the text model's rotary modules to take such positions (a subclass swap of
each attention's ``rope``, as ``platform.lean_blocks`` swaps blocks: the modules, and so every
fused path that reads their settings, stay as they are); :func:`positioned` makes them apply while a
forward is built, and nothing changes outside it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel.engine.vision.prepared import PlacedImage


def mrope_positions(n_tokens: int, images: Sequence[PlacedImage]) -> np.ndarray:
    """``[3, n_tokens]`` (time, row, column) positions of a prompt with ``images`` at their places."""
    out = np.zeros((3, n_tokens), dtype=np.int64)
    next_pos, i = 0, 0
    for placed in sorted(images, key=lambda p: p.start):
        text = placed.start - i
        out[:, i:placed.start] = next_pos + np.arange(text)
        next_pos += text
        t, h, w = placed.image.grid
        grid = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")).reshape(3, -1)
        out[:, placed.start:placed.end] = next_pos + grid
        next_pos += max(t, h, w)
        i = placed.end
    out[:, i:] = next_pos + np.arange(n_tokens - i)
    return out


def shifted(positions: np.ndarray) -> tuple[np.ndarray, int]:
    """``positions`` moved so the next token after them sits at their count, and the move."""
    n = positions.shape[1]
    shift = n - (int(positions.max()) + 1) if n else 0
    return positions + shift, shift


@dataclass(frozen=True)
class PositionPlan:
    """What the rotary modules apply in one forward: explicit ``positions`` ``[3, L]`` for the chunk's
    tokens, or (None) the cache offset plus ``shift``."""

    shift: int = 0
    positions: mx.array | None = None


_active = threading.local()


@contextmanager
def positioned(plan: PositionPlan | None) -> Iterator[None]:
    """Forwards built inside place their tokens by ``plan``."""
    previous = getattr(_active, "plan", None)
    _active.plan = plan
    try:
        yield
    finally:
        _active.plan = previous


def active_plan() -> PositionPlan | None:
    return getattr(_active, "plan", None)


def _rotated(x: mx.array, positions: mx.array, rope, sections: tuple[int, ...]) -> mx.array:
    """``x`` ``[B, H, L, D]`` rotated at per-token M-RoPE ``positions`` ``[3, L]`` (the non-interleaved
    half-split layout of Qwen2/2.5-VL: frequency ``i`` turns with the axis whose section holds it)."""
    dims, base, scale = int(rope.dims), float(rope.base), float(getattr(rope, "scale", 1.0))
    half = dims // 2
    inv_freq = 1.0 / (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims))
    axis = np.repeat(np.arange(len(sections)), sections)[:half]
    pos = positions.astype(mx.float32)[mx.array(axis)] * scale  # [half, L]
    angles = pos.T * inv_freq  # [L, half]
    cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:dims], x[..., dims:]
    if rope.traditional:
        raise ValueError("M-RoPE on an interleaved (traditional) rotary layout is not supported")
    out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if rest.shape[-1]:
        out.append(rest)
    return mx.concatenate(out, axis=-1)


class _PositionedRope:
    """Mixed in ahead of a rotary module's class (:func:`install`)."""

    _mrope_sections: tuple[int, ...] = ()

    def __call__(self, x, offset=0):
        plan = active_plan()
        if plan is None:
            return super().__call__(x, offset)
        if plan.positions is None:
            return super().__call__(x, offset + plan.shift)
        return _rotated(x, plan.positions, self, self._mrope_sections)


_swapped: dict[type, type] = {}


def install(model, sections: Sequence[int]) -> int:
    """Swap every attention's rotary module of ``model`` to take planned positions; the count."""
    count = 0
    for _, module in model.named_modules():
        rope = getattr(module, "rope", None) if hasattr(module, "q_proj") else None
        if rope is None:
            continue
        cls = type(rope)
        if not issubclass(cls, _PositionedRope):
            if cls not in _swapped:
                _swapped[cls] = type(f"Positioned{cls.__name__}", (_PositionedRope, cls), {"__module__": cls.__module__})
            rope.__class__ = _swapped[cls]
        object.__setattr__(rope, "_mrope_sections", tuple(int(s) for s in sections))
        count += 1
    return count


def mrope_sections(config: dict) -> tuple[int, ...] | None:
    """The text model's ``mrope_section`` (rotary frequency pairs per axis), wherever the config keeps it."""
    for holder in (config, config.get("text_config") or {}):
        for key in ("rope_scaling", "rope_parameters"):
            section = (holder.get(key) or {}).get("mrope_section")
            if section:
                return tuple(int(s) for s in section)
    return None
