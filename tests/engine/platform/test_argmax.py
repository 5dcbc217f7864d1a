"""The extension's argmax (``platform.argmax``) gives MLX's own answer on every row, whatever the
values (NaN first or later, infinities, ties, signed zeros), the row length and the threads."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.argmax import argmax_last

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")
NAN, INF = float("nan"), float("inf")


def rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    out = []
    for n in (1, 2, 15, 16, 17, 33, 100, 49152):
        for case in range(9):
            x = rng.standard_normal(n).astype(np.float32)
            if case == 1:
                x[0] = NAN
            elif case == 2 and n > 1:
                x[rng.integers(1, n)] = NAN
            elif case == 3:
                x[:] = np.float32(2.5)  # all tied: the first
            elif case == 4 and n > 2:
                j, k = sorted(rng.choice(n, 2, replace=False))
                x[j] = x[k] = 9.0  # a tie: the first of the two
            elif case == 5:
                x[:] = -INF
                x[rng.integers(0, n)] = NAN if n > 1 else -INF
            elif case == 6 and n > 2:
                x[:] = -1.0
                x[n // 2], x[n - 1] = -0.0, 0.0  # signed zeros compare equal
            elif case == 7:
                x[rng.integers(0, n)] = INF
                x[rng.integers(0, n)] = INF
            elif case == 8:
                x[:] = NAN
            out.append(x)
    return out


def test_every_row_gets_mlx_argmax():
    for x in rows():
        a = mx.array(x)[None]
        assert argmax_last(a).tolist() == mx.argmax(a, axis=-1).tolist(), (len(x), x[:4])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_block_of_rows_split_among_threads(threads):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((37, 3000)).astype(np.float32)
    x[5, 0] = NAN
    x[7, 100] = x[7, 40] = 50.0
    x[9] = -INF
    x[11, 2000] = x[11, 2500] = NAN
    before = qmatmul.set_thread_split(1, 0)
    kept = qmatmul.extension().num_threads()
    try:
        qmatmul.set_threads(threads)
        got = argmax_last(mx.array(x.reshape(37, 1, 3000)))
        mx.eval(got)
    finally:
        qmatmul.set_threads(kept)
        qmatmul.set_thread_split(*before)
    want = mx.argmax(mx.array(x), axis=-1)
    assert got.shape == (37, 1) and got.dtype == want.dtype
    assert got.reshape(-1).tolist() == want.tolist()


def test_strided_and_lower_precision_inputs():
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal((6, 40)).astype(np.float32))
    for a in (x.T, x.astype(mx.bfloat16), x.astype(mx.float16)):
        assert argmax_last(a).tolist() == mx.argmax(a, axis=-1).tolist()
