"""Per-sequence KV caches and exact rewind.

A cache is mlx-lm's per-layer list (``make_prompt_cache``): ``KVCache``, ``RotatingKVCache``
(sliding window / ``--max-kv-size``), ``QuantizedKVCache``, ``ChunkedKVCache``, ``ArraysCache``
(recurrent state) or a ``CacheList`` of those. mlx-lm's own ``trim_prompt_cache`` trims
"as much as it can" and returns a count; speculative decoding needs a stronger promise: after
``rewind(cache, n)`` the cache is *exactly* the cache a fresh prefill of the shorter sequence
would have built, or nothing changed and ``CacheRewindError`` says why. That is what this
module adds (written here because mlx-lm has no all-or-nothing rewind and its
``ConcatenateKVCache.trim`` leaves the dropped entries visible to attention).

When a rewind is exact, per cache kind:

- ``KVCache`` / ``QuantizedKVCache``: always (entries are stored per position; trimming just
  moves the write offset back).
- ``ConcatenateKVCache``: always; the stored arrays are sliced to the new length.
- ``RotatingKVCache``: while it has never evicted anything (``offset <= max_size``); once
  it has wrapped, only the newest entries of a multi-token forward, which mlx-lm keeps in
  temporal order on top of a full window (what a speculative verify round needs to drop its
  rejected drafts). Anything else would need evicted tokens back, so it is refused.
- ``ChunkedKVCache``: only back to the start of its current chunk.
- ``ArraysCache`` (SSM / linear-attention state): the state is a running summary that cannot be
  un-applied, so only with a ``recurrent.StateTape`` of the forward that added the tokens being
  dropped (what a speculative verify round records); without one, never. Rewinding by 0 is always
  allowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from mlxcel.engine.errors import CacheRewindError

if TYPE_CHECKING:
    from mlxcel.engine.cache.recurrent import StateTape


def _leaves(cache: list[Any]) -> list[Any]:
    """Every per-layer cache object, with ``CacheList`` groups flattened."""
    out: list[Any] = []
    for c in cache:
        if isinstance(c, CacheList):
            out.extend(_leaves(list(c.caches)))
        else:
            out.append(c)
    return out


def cache_length(cache: list[Any]) -> int:
    """How many tokens the cache has consumed (the absolute position of the next token).

    Read from the layers that track positions; recurrent-only caches do not, and raise."""
    lengths = {int(c.offset) for c in _leaves(cache) if hasattr(c, "offset")}
    if not lengths:
        raise TypeError("this cache tracks no token positions (recurrent state only)")
    if len(lengths) > 1:
        raise CacheRewindError(f"cache layers disagree on their length: {sorted(lengths)}")
    return lengths.pop()


def _refusal(c: Any, n: int, tape: StateTape | None = None) -> str | None:
    """Why one layer's cache cannot drop its last ``n`` tokens exactly, or None if it can."""
    offset = getattr(c, "offset", None)
    if offset is not None and n > offset:
        return f"it holds only {offset} tokens"
    if isinstance(c, RotatingKVCache):
        if c.offset > c.max_size and not _recent_in_order(c, n):
            return (f"its sliding window ({c.max_size} tokens) has already wrapped "
                    f"({c.offset} tokens seen); the evicted tokens cannot be restored")
        return None
    if isinstance(c, ChunkedKVCache):
        if n > c.offset - c.start_position:
            return f"the rewind crosses a chunk boundary at position {c.start_position}"
        return None
    if isinstance(c, ArraysCache):
        if tape is not None and tape.covers(c, n):
            return None
        return "recurrent state cannot be rewound (no record of the forward that added those tokens)"
    if offset is None:
        return f"{type(c).__name__} does not track token positions"
    return None


def _recent_in_order(c: RotatingKVCache, n: int) -> bool:
    """A wrapped rotating cache can still drop its newest ``n`` tokens right after a multi-token
    forward: mlx-lm then stores the window in temporal order plus the block (``max_size - 1 + S``
    entries), so ``n`` of the block's entries can go as long as a full window stays (or the
    buffer still holds every token of the shorter sequence)."""
    if c.keys is None or c._idx != c.keys.shape[2]:
        return False
    kept = c.keys.shape[2] - n
    return kept >= c.max_size or kept == c.offset - n  # a full window stays, or nothing was evicted


def can_rewind(cache: list[Any], n: int, tape: StateTape | None = None) -> bool:
    """Whether ``rewind(cache, n, tape)`` would succeed."""
    if n < 0:
        return False
    if n == 0:
        return True
    return all(_refusal(c, n, tape) is None for c in _leaves(cache))


def rewind(cache: list[Any], n: int, tape: StateTape | None = None) -> None:
    """Drop the last ``n`` tokens from every layer, exactly, in place. Recurrent layers need the
    ``tape`` of the forward that added those tokens (``recurrent.StateTape``).

    Raises ``CacheRewindError`` (leaving the cache untouched) when any layer cannot."""
    if n < 0:
        raise CacheRewindError(f"cannot rewind by a negative count ({n})")
    if n == 0:
        return
    leaves = _leaves(cache)
    for i, c in enumerate(leaves):
        why = _refusal(c, n, tape)
        if why is not None:
            raise CacheRewindError(f"cannot rewind the KV cache by {n} tokens: layer {i} {why}")
    for c in leaves:
        if isinstance(c, ArraysCache):
            tape.rewind_layer(c, n)
        elif isinstance(c, ConcatenateKVCache):
            c.offset -= n
            c.keys = c.keys[..., : c.offset, :]
            c.values = c.values[..., : c.offset, :]
        elif isinstance(c, RotatingKVCache) and c.offset > c.max_size:
            # Wrapped, but a multi-token forward just left the buffer in temporal order with at least
            # max_size entries to spare: dropping its newest n leaves what a forward of the shorter
            # block would have left (the window behind every kept token is intact).
            c.keys = c.keys[..., : c.keys.shape[2] - n, :]
            c.values = c.values[..., : c.values.shape[2] - n, :]
            c.offset -= n
            c._idx = c.keys.shape[2]
        elif isinstance(c, RotatingKVCache):
            # Never wrapped, so the buffer is in temporal order and _idx tracks offset.
            c.offset -= n
            c._idx = c.offset
        else:
            c.trim(n)


def read_keys_values(c: Any) -> tuple[mx.array, mx.array, int]:
    """What one attention layer's cache holds, for a reader that attends to it (a drafter reading
    the target's cache): ``(keys, values, first_position)``, keys/values ``[B, heads, n, d]`` in
    temporal order (a rotating cache that wrapped is unrolled, as mlx-lm orders it before a
    multi-token forward), the entry ``j`` being the token at absolute position ``first_position + j``."""
    if c.keys is None:
        raise CacheRewindError("the cache is empty")
    if isinstance(c, RotatingKVCache):
        keys, values = _temporal(c, c.keys), _temporal(c, c.values)
    elif isinstance(c, QuantizedKVCache):
        raise CacheRewindError("a quantized KV cache cannot be read as keys and values")
    else:
        keys, values = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
    return keys, values, int(c.offset) - int(keys.shape[2])


def _temporal(c: RotatingKVCache, v: mx.array) -> mx.array:
    if c._idx == v.shape[2]:
        return v
    if c._idx < c.offset:  # wrapped: the oldest entries sit after the write index
        return mx.concatenate([v[..., : c.keep, :], v[..., c._idx:, :], v[..., c.keep : c._idx, :]], axis=2)
    return v[..., : c._idx, :]
