"""The fused CPU attention (``qmatmul_src/fused.cpp``: eight keys scored at once, heads and runs of
queries split among the kernel threads) against a float64 reference, and the promises the block
verification rests on: a query's bits do not depend on the thread count, on how many other
queries the call has, on the key/value strides, or on which primitive (``attention`` /
``ragged_attention``) computes it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.platform import qmatmul

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")

# (batch, query heads, kv heads, queries, keys, head size): decode over keys that fill no group of 8,
# a prefill, more keys than queries, and head sizes that are not a multiple of 8 or of 64.
SHAPES = [(1, 9, 3, 1, 41, 64), (2, 6, 2, 3, 11, 64), (1, 4, 4, 17, 17, 128), (1, 2, 1, 5, 30, 20),
          (1, 2, 2, 9, 9, 96), (1, 3, 1, 40, 300, 64)]


@pytest.fixture
def threads():
    """Every call split among the threads as finely as it goes; the thread count restored after."""
    ext = qmatmul.extension()
    before, split = ext.num_threads(), qmatmul.set_thread_split(1, 0)
    yield lambda n: qmatmul.set_threads(n)
    qmatmul.set_thread_split(*split)
    qmatmul.set_threads(before)


def reference(q, k, v, scale: float, causal: bool) -> np.ndarray:
    q, k, v = (np.array(a, dtype=np.float64) for a in (q, k, v))
    _, hq, L, _ = q.shape
    hk, S = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, hq // hk, axis=1), np.repeat(v, hq // hk, axis=1)
    s = q @ kk.transpose(0, 1, 3, 2) * scale
    if causal:
        s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None] + (S - L), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ vv


def inputs(shape, seed: int):
    b, hq, hk, L, S, d = shape
    keys = mx.random.split(mx.random.key(seed), 3)
    return (mx.random.normal((b, hq, L, d), key=keys[0]), mx.random.normal((b, hk, S, d), key=keys[1]),
            mx.random.normal((b, hk, S, d), key=keys[2]))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64_at_any_thread_count(shape, causal, threads):
    ext = qmatmul.extension()
    q, k, v = inputs(shape, sum(shape))
    scale = shape[-1] ** -0.5
    want = reference(q, k, v, scale, causal)
    outs = []
    for n in (1, 2, 3):
        threads(n)
        outs.append(ext.attention(q, k, v, scale, causal))
    got = np.array(outs[0], dtype=np.float64)
    assert np.abs(got - want).max() <= 2e-6 * max(1.0, np.abs(want).max()), shape
    for o in outs[1:]:
        assert mx.array_equal(o, outs[0]).item(), shape


@pytest.mark.parametrize("shape", SHAPES)
def test_a_query_gets_the_same_bits_alone_as_in_a_block(shape, threads):
    """Causal: query l of an L-query call is bitwise the one-query call over keys 0 .. S - L + l
    (what a one-token decode step computes for it); threads on, so the block is split."""
    ext = qmatmul.extension()
    threads(2)
    q, k, v = inputs(shape, 7 + sum(shape))
    _, _, _, L, S, d = shape
    block = ext.attention(q, k, v, d ** -0.5, True)
    for l in range(L):
        n = S - L + l + 1
        one = ext.attention(q[:, :, l:l + 1], k[:, :, :n], v[:, :, :n], d ** -0.5, True)
        assert mx.array_equal(one[:, :, 0], block[:, :, l]).item(), (shape, l)


def test_strided_keys_and_values_give_the_same_bits():
    """Key/value rows read in place through their strides (a transposed cache, a feature stride
    other than 1) compute the same arithmetic as contiguous rows."""
    ext = qmatmul.extension()
    for shape in ((1, 6, 2, 4, 37, 64), (1, 2, 1, 3, 19, 20)):
        q, k, v = inputs(shape, 3)
        want = ext.attention(q, k, v, 0.3, True)
        kt = mx.contiguous(k.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # feature stride = S
        vt = mx.contiguous(v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # token-major cache
        for kk, vv in ((kt, v), (k, vt), (kt, kt * 0 + vt)):
            assert mx.array_equal(ext.attention(q, kk, vv, 0.3, True), want).item(), shape


def test_ragged_attention_is_attention_at_any_thread_count(threads):
    ext = qmatmul.extension()
    k = mx.random.normal((2, 2, 300, 64), key=mx.random.key(11))
    v = mx.random.normal((2, 2, 300, 64), key=mx.random.key(12))
    # decode rows, short blocks, a prompt chunk longer than one group of queries, a row met again
    rows = [0, 0, 1, 1, 1] + [1] * 12 + [0]
    positions = [7, 8, 250, 251, 252] + list(range(260, 272)) + [9]
    q = mx.random.normal((len(rows), 6, 64), key=mx.random.key(13))
    outs = []
    for n in (1, 2):
        threads(n)
        outs.append(ext.ragged_attention(q, k, v, mx.array(rows, dtype=mx.int32),
                                         mx.array(positions, dtype=mx.int32), 0.125))
    assert mx.array_equal(outs[0], outs[1]).item()
    for i, (r, p) in enumerate(zip(rows, positions, strict=True)):
        want = ext.attention(q[i][None, :, None], k[r:r + 1, :, :p + 1], v[r:r + 1, :, :p + 1], 0.125, True)
        assert mx.array_equal(outs[0][i], want[0, :, 0]).item(), i
