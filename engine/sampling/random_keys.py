"""Randomness derived from (seed, absolute position).

Every emitted position draws from its own key, a pure function of the request seed and the
token's absolute index in the sequence. Decoding one token at a time and verifying a drafted
block therefore consume the *same* randomness for the same position, which is what makes
speculative sampling reproduce plain sampling token for token under the same seed.
"""

from __future__ import annotations

import secrets

import mlx.core as mx

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def resolve_seed(seed: int | None) -> int:
    """A concrete seed: the given one, or a fresh random one for -1/None (llama-server's default)."""
    if seed is None or seed < 0:
        return secrets.randbits(32)
    return int(seed) & 0xFFFFFFFF


def position_key(seed: int, position: int, stream: int = 0) -> mx.array:
    """The PRNG key for absolute ``position`` of a sequence seeded with ``seed``.

    ``stream`` separates independent uses at one position (0: the emitted-token draw;
    1: the rejection-sampling accept test; 2: the residual draw)."""
    mixed = _splitmix64(_splitmix64((seed & 0xFFFFFFFF) << 20 ^ stream) ^ position)
    return mx.random.key(mixed & 0x7FFFFFFFFFFFFFFF)
