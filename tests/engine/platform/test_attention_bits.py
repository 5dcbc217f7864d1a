"""The fused attention's result is the arithmetic its source defines, bit for bit.

fused.cpp states what one query's output is (the order of every float32 operation: the fused
multiply-adds of the score lanes, their tree, the polynomial exp, the per-lane sum of weights, the
fused multiply-adds of the weighted sums in key order). The kernel runs one of three compilations
(AVX-512 with two queries a register, AVX2 + FMA, or std::fma lane by lane; the kernels' ISA set to
"avx2" or "scalar" caps it, which is how each is tested on a CPU that has the others);
this test computes the stated arithmetic with numpy's float32 operations (each one IEEE-rounded, as
the C++ is with -ffp-contract=off) and requires equality from both, so the kernel computes the
definition, not an approximation of it. Head sizes cover the 8-wide and one-lane parts of the
weighted sum.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.platform import qmatmul

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")

f32 = np.float32


def fma(a, b, c) -> np.ndarray:
    """a * b + c rounded once to float32. The float32 product is exact in float64; the float64 sum
    is rounded once more, which changes the float32 result only when it lands exactly halfway
    between two float32 values (about one sum in 2^29), and then this test fails rather than passes."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(f32)


def exp_poly(x: np.ndarray) -> np.ndarray:
    t = np.minimum(f32(88.0), np.maximum(f32(-87.0), x))
    k = np.floor(t * f32(1.44269504088896341) + f32(0.5))
    r = t - k * f32(0.693359375)
    r = r - k * f32(-2.12194440e-4)
    p = np.full_like(r, f32(1.9875691500e-4))
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + f32(c)
    p = ((p * r) * r + r) + f32(1.0)
    two_k = ((k.astype(np.int32) + 127) << 23).view(np.float32)
    return p * two_k


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    d = q.shape[0]
    d8 = (d + 7) // 8 * 8
    qs = np.zeros(d8, f32)
    qs[:d] = q * f32(scale)
    kp = np.zeros((keys.shape[0], d8), f32)
    kp[:, :d] = keys
    lanes = np.zeros((keys.shape[0], 8), f32)
    for c in range(0, d8, 8):
        lanes = fma(qs[c:c + 8], kp[:, c:c + 8], lanes)
    p = lanes.T
    score = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]))
    e = exp_poly(score - score.max())
    s = np.zeros(8, f32)
    for j in range(0, len(e), 8):
        chunk = np.zeros(8, f32)
        chunk[:len(e[j:j + 8])] = e[j:j + 8]
        s = s + chunk
    inv = f32(1.0) / (((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])))
    acc = np.zeros(d, f32)
    for j in range(len(e)):
        acc = fma(e[j], values[j], acc)
    return acc * inv


@pytest.mark.parametrize("d", [64, 80, 72, 20])
@pytest.mark.parametrize("heads", [(4, 2, 37, 5), (6, 2, 70, 30)], ids=["few-queries", "key-head-groups"])
@pytest.mark.parametrize("isa", ["auto", "avx2", "scalar"])
def test_attention_is_its_stated_arithmetic(d, heads, isa):
    """The second shape has enough queries that every query head of a key head is computed in one
    group (the keys read once for all of them), its queries' key counts spanning several blocks."""
    ext = qmatmul.extension()
    before = ext.isa()
    ext.set_isa(isa)
    try:
        check_stated_arithmetic(d, heads)
    finally:
        ext.set_isa(before)


def check_stated_arithmetic(d, heads):
    rng = np.random.default_rng(d)
    hq, hk, s, length = heads
    q = rng.standard_normal((1, hq, length, d)).astype(f32)
    k = rng.standard_normal((1, hk, s, d)).astype(f32)
    v = rng.standard_normal((1, hk, s, d)).astype(f32)
    scale = float(f32(1.0 / np.sqrt(d)))
    got = np.array(qmatmul.extension().attention(mx.array(q), mx.array(k), mx.array(v), scale, True))
    for h in range(hq):
        for i in range(length):
            n = s - length + i + 1
            want = attend(q[0, h, i], k[0, h // (hq // hk), :n], v[0, h // (hq // hk), :n], scale)
            assert np.array_equal(got[0, h, i], want), (d, h, i)
