"""The float32 kernel (packed type F32, engine/platform/qmatmul_src/fkernel*.cpp) against float64
references, and its exactness: a row's result is the same bits whatever the call's row count
(1..16, and 40: chunks of rows), the thread count and the ISA.

Error bound, per output: each sum is k fused multiply-adds in float32 from zero, so

    |y - y_ref| <= k * 2**-24 * sum_j |x_j w_j|  (+ 1e-30)

(each addition rounds once, by at most half an ulp of the running sum, which is at most
sum_j |x_j w_j|; the products are exact inside the FMA)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.packed_modules import PackedEmbedding, PackedLinear, pack_float_modules

pytestmark = pytest.mark.skipif(not qmatmul.available() or not hasattr(qmatmul.extension(), "repack_float"),
                                reason="the CPU kernels are not built here")

ROWS = (*range(1, 17), 40)


def isas() -> list[str]:
    return qmatmul.extension().available_isas().split(",")


@pytest.fixture
def ext():
    ext = qmatmul.extension()
    isa, threads = ext.isa(), ext.num_threads()
    yield ext
    ext.set_isa(isa)
    ext.set_num_threads(threads)


def bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.shape[1] * 2.0 ** -24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T) + 1e-30


@pytest.mark.parametrize("n,k", [(37, 64), (300, 96), (16, 33)])  # n off the 16-feature tile; odd k
def test_against_float64_and_bitwise_per_row(n, k, ext):
    rng = np.random.default_rng(n + k)
    w_np = rng.standard_normal((n, k)).astype(np.float32)
    x_np = rng.standard_normal((max(ROWS), k)).astype(np.float32)
    w = qmatmul.pack_float(mx.array(w_np))
    assert w.packed.nbytes == ext.packed_nbytes(qmatmul.F32, 0, n, k) == -(-n // 16) * 16 * k * 4
    assert np.array_equal(np.array(qmatmul.dequantize(w)), w_np)
    ref = x_np.astype(np.float64) @ w_np.astype(np.float64).T
    tol = bound(x_np, w_np)
    first = np.array(qmatmul.qmatmul(mx.array(x_np), w))  # the 40-row product on the default ISA
    for isa in isas():
        ext.set_isa(isa)
        for threads in (1, 2):
            ext.set_num_threads(threads)
            for m in ROWS:
                y = np.array(qmatmul.qmatmul(mx.array(x_np[:m]), w))
                assert np.all(np.abs(y - ref[:m]) <= tol[:m]), (isa, threads, m)
                assert np.array_equal(y, first[:m]), (isa, threads, m)  # every row's bits, at any width


def test_every_row_alone_equals_its_row_in_a_block(ext):
    rng = np.random.default_rng(7)
    n, k = 1536, 576  # SmolLM2's MLP: many tiles, split over two threads
    w = qmatmul.pack_float(mx.array(rng.standard_normal((n, k)).astype(np.float32)))
    x = rng.standard_normal((16, k)).astype(np.float32)
    ext.set_num_threads(2)
    block = np.array(qmatmul.qmatmul(mx.array(x), w))
    for r in range(16):
        assert np.array_equal(np.array(qmatmul.qmatmul(mx.array(x[r:r + 1]), w)), block[r:r + 1])


def test_multi_mixes_float_and_quantized(ext):
    rng = np.random.default_rng(3)
    k = 64
    wf = qmatmul.pack_float(mx.array(rng.standard_normal((40, k)).astype(np.float32)))
    wq = qmatmul.pack_affine(*mx.quantize(mx.array(rng.standard_normal((32, k)).astype(np.float32)), 32, 4), 4, 32)
    x = mx.array(rng.standard_normal((5, k)).astype(np.float32))
    for ws in ([wf, wf], [wf, wq], [wq, wf]):
        outs = qmatmul.qmatmul_multi(x, ws)
        for y, w in zip(outs, ws):
            assert np.array_equal(np.array(y), np.array(qmatmul.qmatmul(x, w)))


def test_strided_input_is_read_in_place(ext):
    rng = np.random.default_rng(4)
    w = qmatmul.pack_float(mx.array(rng.standard_normal((48, 32)).astype(np.float32)))
    xt = mx.array(rng.standard_normal((32, 6)).astype(np.float32)).T  # a transposed view
    assert np.array_equal(np.array(qmatmul.qmatmul(xt, w)), np.array(qmatmul.qmatmul(mx.contiguous(xt), w)))


def test_pack_float_modules_keeps_the_layers_outputs():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 32)
            self.proj = nn.Linear(32, 64, bias=True)
            self.head = nn.Linear(64, 50, bias=False)
            self.small = nn.Linear(4, 16)  # off the kernels' shapes (inputs not a multiple of 32): left alone

    mx.random.seed(0)
    model = Tiny()
    ids = mx.array([[1, 5, 49]])
    x = model.embed(ids)
    ref = model.head(model.proj(x))
    table = np.array(model.embed.weight)
    assert pack_float_modules(model) == 3
    assert isinstance(model.embed, PackedEmbedding) and isinstance(model.proj, PackedLinear)
    assert type(model.small) is nn.Linear
    assert np.array_equal(np.array(model.embed(ids)), np.array(x))
    assert np.array_equal(np.array(model.embed.weight), table)  # .weight still readable
    out = np.array(model.head(model.proj(model.embed(ids))))
    assert np.allclose(out, np.array(ref), rtol=1e-5, atol=1e-5)
    assert np.allclose(np.array(model.embed.as_linear(x)), np.array(x @ model.embed.weight.T), rtol=1e-5, atol=1e-5)
    new = mx.random.normal((64, 32))
    model.proj.weight = new  # re-laid in place
    assert np.array_equal(np.array(model.proj.weight), np.array(new))
    assert np.allclose(np.array(model.proj(x)), np.array(x @ new.T + model.proj.bias), rtol=1e-5, atol=1e-5)
