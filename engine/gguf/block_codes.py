"""The llama.cpp block types that are MLX affine (or MXFP4) quantization in disguise, taken apart
into MLX's pieces: per element an unsigned integer code, per group of 32 elements one scale and
one bias, with ``w = scale * code + bias`` exactly (gguf-py's ``quants.py`` decodes the same
bytes; the derivation of each type is in its function).

Every function takes raw blocks, shape ``(n_blocks, bytes_per_block)``, and returns
``(codes uint8 (n_blocks, elements), scales float32 (n_blocks, elements // 32),
biases float32 (n_blocks, elements // 32))``. Scales and biases are products of a float16 and a
small integer, so float32 holds them exactly; only their cast to the compute dtype rounds.
For MXFP4 the "scale" is the stored E8M0 exponent byte and there is no bias.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K

GROUP = 32

Pieces = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 field at byte ``at`` of every block, as float32 (n_blocks, 1)."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Codes of 32 elements stored as 16 bytes: element j in the low nibble of byte j, element
    j + 16 in the high one (every 32-element run of the legacy types, IQ4_NL and MXFP4)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bit(qh: np.ndarray) -> np.ndarray:
    """The high bit of each of 32 codes, bit j of a little-endian uint32 (Q5_0, Q5_1)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q4_0(blocks: np.ndarray) -> Pieces:
    # w = d (q - 8): scale d, bias -8 d
    d = _half(blocks, 0)
    return _nibbles(blocks[:, 2:18]), d, -8 * d


def _q4_1(blocks: np.ndarray) -> Pieces:
    # w = d q + m: scale d, bias m
    return _nibbles(blocks[:, 4:20]), _half(blocks, 0), _half(blocks, 2)


def _q5_0(blocks: np.ndarray) -> Pieces:
    # w = d (q - 16), q = low nibble | bit j of qh << 4: scale d, bias -16 d
    d = _half(blocks, 0)
    return _nibbles(blocks[:, 6:22]) | (_fifth_bit(blocks[:, 2:6]) << 4), d, -16 * d


def _q5_1(blocks: np.ndarray) -> Pieces:
    # w = d q + m: scale d, bias m
    codes = _nibbles(blocks[:, 8:24]) | (_fifth_bit(blocks[:, 4:8]) << 4)
    return codes, _half(blocks, 0), _half(blocks, 2)


def _q8_0(blocks: np.ndarray) -> Pieces:
    # w = d q, q int8: code q + 128 (the int8's byte with its top bit flipped), bias -128 d
    d = _half(blocks, 0)
    return blocks[:, 2:34] ^ np.uint8(0x80), d, -128 * d


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: w = d sc q - dmin m per 32-element sub-block (six-bit sc and m, unpacked by
    gguf-py's own ``get_scale_min``): scale d sc, bias -dmin m."""
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    return _half(blocks, 0) * sc.astype(np.float32), -_half(blocks, 2) * m.astype(np.float32)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes holding 256 four-bit codes: each 64-element chunk is 32 bytes, its first 32
    elements in the low nibbles, the next 32 in the high ones."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 256)


def _q4_k(blocks: np.ndarray) -> Pieces:
    scale, bias = _k_scales(blocks)
    return _k_low_nibbles(blocks[:, 16:144]), scale, bias


def _q5_k(blocks: np.ndarray) -> Pieces:
    # the fifth bit of element j of sub-block i is bit i of qh[j]
    scale, bias = _k_scales(blocks)
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    return _k_low_nibbles(blocks[:, 48:176]) | ((qh & 1) << 4).reshape(-1, 256), scale, bias


def _mxfp4(blocks: np.ndarray) -> Pieces:
    # w = 2^(e - 128) * kvalue[q], kvalues the doubled E2M1 values: exactly MLX's mxfp4,
    # 2^(e - 127) * e2m1[q], with the same 4-bit E2M1 codes.
    return _nibbles(blocks[:, 1:17]), blocks[:, 0:1], None


EXACT = {Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q5_0: _q5_0, Q.Q5_1: _q5_1, Q.Q8_0: _q8_0,
         Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.MXFP4: _mxfp4}


def pieces(qtype: Q, blocks: np.ndarray) -> Pieces:
    """(codes, scales, biases) of raw blocks of an ``EXACT`` type."""
    return EXACT[qtype](blocks)
