"""The CPU kernels for quantized weights (engine/platform/qmatmul.py) against float64 references.

Every packed type is checked on random blocks (random bytes are valid blocks; the f16 scale
fields are set to finite values): the packed matrix dequantizes to exactly what the ``gguf``
package's reference decoder (or ``mx.dequantize`` for MLX's affine format) gives, and a product
with float activations stays within the error of 8-bit activations, stated per output as

    |y - y_ref| <= sum over 32-blocks b of (max_b |x| / 254) * sum_b |w|  (+ 1e-6 relative slack)

(each activation is rounded to the nearest of 255 levels of its block: at most half a step,
max|x| / 254, from its value; float32 accumulation adds far less than the slack). Every ISA the
CPU has computes the same bits, and a row's result does not depend on how many rows the call
has, nor on the thread count: what block verification needs (docs/speculative-acceptance.md).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from quant_blocks import HALF_FIELDS, random_blocks

from mlxcel.engine.platform import qmatmul

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")



def bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    m, k = x.shape
    amax = np.abs(x).reshape(m, k // 32, 32).max(-1)
    wsum = np.abs(w).reshape(w.shape[0], k // 32, 32).sum(-1)
    return (amax / 254.0) @ wsum.T + 1e-6 * (np.abs(x) @ np.abs(w).T) + 1e-7


def isas() -> list[str]:
    return qmatmul.extension().available_isas().split(",")


@pytest.fixture
def each_isa():
    ext = qmatmul.extension()
    before = ext.isa()
    split = qmatmul.set_thread_split(1, 0)  # every call split among the threads, as finely as it goes
    yield ext
    qmatmul.set_thread_split(*split)
    ext.set_isa(before)


def products(w: qmatmul.PackedWeight, x: np.ndarray, ext) -> dict[str, np.ndarray]:
    out = {}
    for isa in isas():
        ext.set_isa(isa)
        out[isa] = np.array(qmatmul.qmatmul(mx.array(x), w))
    return out


@pytest.mark.parametrize("qtype", list(HALF_FIELDS), ids=lambda t: t.name)
def test_gguf_blocks(qtype, each_isa):
    n, k = 37, 512  # n not a multiple of the 16-feature tile
    raw = random_blocks(qtype, n, k, seed=int(qtype))
    w = qmatmul.pack_gguf(raw, int(qtype), n, k)
    ref_w = quants.dequantize(raw, qtype).reshape(n, k).astype(np.float64)
    assert np.array_equal(np.array(qmatmul.dequantize(w)), ref_w.astype(np.float32))
    x = np.random.default_rng(1).standard_normal((5, k)).astype(np.float32)
    x[0, :32] = np.arange(-15.5, 16.5)  # exact ties when quantized (max 127: x * 127 / max = x):
    x[0, 0] = 127.0                     # every ISA's quantizer rounds them half to even
    got = products(w, x, each_isa)
    ref = x.astype(np.float64) @ ref_w.T
    for isa, y in got.items():
        assert np.all(np.abs(y - ref) <= bound(x, ref_w)), isa
        assert np.array_equal(y, got["scalar"]), f"{isa} differs from the portable kernel"
    # the bound is not vacuous: the error is a visible fraction of it
    assert np.abs(got["scalar"] - ref).max() > 0.01 * bound(x, ref_w).max()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_mlx_affine(bits, group, dtype, each_isa):
    n, k = 24, 256
    rng = np.random.default_rng(bits * group)
    wf = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(dtype)
    wq, scales, biases = mx.quantize(wf, group_size=group, bits=bits)
    w = qmatmul.pack_affine(wq, scales, biases, bits, group)
    ref_w = mx.dequantize(wq, scales.astype(mx.float32), biases.astype(mx.float32), group_size=group, bits=bits)
    assert mx.array_equal(qmatmul.dequantize(w), ref_w)
    ref_w = np.array(ref_w).astype(np.float64)
    x = rng.standard_normal((3, k)).astype(np.float32)
    got = products(w, x, each_isa)
    ref = x.astype(np.float64) @ ref_w.T
    for isa, y in got.items():
        assert np.all(np.abs(y - ref) <= bound(x, ref_w)), isa
        assert np.array_equal(y, got["scalar"]), isa


@pytest.mark.parametrize("k", [512, 1536])
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_width_and_threads_do_not_change_a_row(qtype, k, each_isa):
    """Row r of an m-row product is bitwise the one-row product of row r, for m = 1..16 and a
    prefill width, at one to three threads (pieces of a call claimed by whichever thread comes
    first; three threads on two cores are descheduled mid-call), on every ISA (on AVX-512 the
    K-quants take chunks of 8 rows, the 32-value block types chunks of 4)."""
    n = 70
    w = qmatmul.pack_gguf(random_blocks(qtype, n, k, seed=7), int(qtype), n, k)
    x = mx.array(np.random.default_rng(2).standard_normal((40, k)).astype(np.float32))
    threads = each_isa.num_threads()
    try:
        for isa in isas():
            each_isa.set_isa(isa)
            each_isa.set_num_threads(1)
            single = mx.concatenate([qmatmul.qmatmul(x[i:i + 1], w) for i in range(40)])
            for t in (1, 2, 3):
                each_isa.set_num_threads(t)
                for m in (*range(2, 17), 40):
                    assert mx.array_equal(qmatmul.qmatmul(x[:m], w), single[:m]), (isa, t, m)
    finally:
        each_isa.set_num_threads(threads)


def test_large_matrix_walk_gives_the_same_bits(each_isa):
    """A matrix over 1 MB (here 1.25 MB of Q8_0) is walked tile by tile; one thread takes that
    path, each of two threads (0.6 MB) the chunk-by-chunk one: the same bits per row either way."""
    n, k = 2304, 512
    w = qmatmul.pack_gguf(random_blocks(Q.Q8_0, n, k, seed=9), int(Q.Q8_0), n, k)
    assert w.packed.nbytes > 1 << 20
    x = mx.array(np.random.default_rng(3).standard_normal((20, k)).astype(np.float32))
    threads = each_isa.num_threads()
    try:
        each_isa.set_num_threads(1)
        single = mx.concatenate([qmatmul.qmatmul(x[i:i + 1], w) for i in range(20)])
        for t in (1, 2):
            each_isa.set_num_threads(t)
            for m in (2, 5, 8, 16, 20):
                assert mx.array_equal(qmatmul.qmatmul(x[:m], w), single[:m]), (t, m)
    finally:
        each_isa.set_num_threads(threads)


def test_packed_buffers_are_cache_line_aligned():
    """Every packed matrix starts on a 64-byte boundary (each 64-byte load of the kernels in one
    cache line); MLX's own copy of a buffer starts 24 bytes past one, so a repack that went
    through a copy would fail here."""
    def address(a: mx.array) -> int:
        return np.array(a, copy=False).__array_interface__["data"][0]

    weights = [qmatmul.pack_gguf(random_blocks(t, n, k, seed=4), int(t), n, k)
               for t, n, k in ((Q.Q4_K, 48, 512), (Q.Q6_K, 1024, 2048), (Q.Q8_0, 16, 64))]
    qw, scales, biases = mx.quantize(mx.random.normal((32, 128), key=mx.random.key(1)), group_size=64, bits=4)
    weights.append(qmatmul.pack_affine(qw, scales, biases, 4, 64))
    weights.append(qmatmul.pack_float(mx.random.normal((40, 96), key=mx.random.key(2))))
    for w in weights:
        assert address(w.packed) % 64 == 0, (w.qtype, w.n, w.k)


def test_product_outputs_are_cache_line_aligned():
    """The kernels store a row's 16 outputs of a tile as one 64-byte store: every product's output
    starts on a 64-byte boundary, with the same values as any copy of it (MLX's own buffers start
    8 or 24 bytes past one)."""
    def address(a: mx.array) -> int:
        return np.array(a, copy=False).__array_interface__["data"][0]

    n, k = 48, 512
    w = qmatmul.pack_gguf(random_blocks(Q.Q4_K, n, k, seed=5), int(Q.Q4_K), n, k)
    w2 = qmatmul.pack_gguf(random_blocks(Q.Q8_0, 32, k, seed=6), int(Q.Q8_0), 32, k)
    for m in (1, 3, 17):
        x = mx.random.normal((m, k), key=mx.random.key(m))
        outs = [qmatmul.qmatmul(x, w), *qmatmul.qmatmul_multi(x, [w, w2])]
        mx.eval(outs)
        for out in outs:
            assert address(out) % 64 == 0, (m, out.shape)
        assert mx.array_equal(outs[0], outs[1]).item() and mx.array_equal(outs[0] + 0, outs[0]).item()


def test_embedding_rows_and_leading_axes():
    n, k = 20, 256
    w = qmatmul.pack_gguf(random_blocks(Q.Q4_K, n, k), int(Q.Q4_K), n, k)
    full = qmatmul.dequantize(w)
    ids = mx.array([[3, 19, 0], [7, 7, 25]])
    rows = qmatmul.dequant_rows(ids, w)
    assert rows.shape == (2, 3, k)
    assert mx.array_equal(rows[0, 1], full[19]) and mx.array_equal(rows[1, 0], full[7])
    assert not mx.any(rows[1, 2]).item()  # out of range: zeros
    x = mx.random.normal((2, 3, k), key=mx.random.key(0))
    assert qmatmul.qmatmul(x, w).shape == (2, 3, n)
    assert mx.array_equal(qmatmul.qmatmul(x, w)[1], qmatmul.qmatmul(x[1], w))
    assert qmatmul.qmatmul(x.astype(mx.bfloat16), w).dtype == mx.bfloat16


def test_rejects_mismatched_shapes():
    w = qmatmul.pack_gguf(random_blocks(Q.Q4_0, 16, 64), int(Q.Q4_0), 16, 64)
    with pytest.raises(ValueError):
        qmatmul.qmatmul(mx.zeros((1, 96)), w)
    with pytest.raises(ValueError):
        qmatmul.extension().repack_gguf(mx.zeros((16, 10), dtype=mx.uint8), int(Q.Q4_0), 16, 64)


def test_smollm2_greedy_follows_the_float32_path(monkeypatch):
    """The built-in SmolLM2 (Q4_1) loaded packed decodes the same greedy tokens as its exactly
    dequantized float32 load, or the first divergence is a tie within the 8-bit activations'
    error: there, the float32 logits of the two candidate tokens are closer than the largest
    logit difference between the two paths, which stays under 1.0 (measured 0.6-0.8; logits here
    span ~30). Before the divergence at least 16 tokens agree (measured 20-40 on three prompts)."""
    from mlx.utils import tree_flatten

    from mlxcel.engine.decode.plain import generate_tokens
    from mlxcel.engine.gguf.file import read_gguf
    from mlxcel.engine.model.loading import load_model
    from mlxcel.engine.sampling.chain import SamplerChain
    from mlxcel.engine.sampling.params import SamplerParams

    packed = load_model(None)
    weight_bytes = sum(v.nbytes for _, v in tree_flatten(packed.model.parameters()))
    file_bytes = sum(t.data.nbytes for t in read_gguf(packed.path).tensors.values())
    assert weight_bytes <= 1.15 * file_bytes
    monkeypatch.setenv("MLXCEL_WEIGHTS", "float32")
    floats = load_model(None)

    def greedy(lm, ids, until=None):
        chain = SamplerChain(SamplerParams(temperature=0.0), vocab_size=lm.vocab_size)
        out = []
        for step in generate_tokens(lm.model, ids, chain, cache=lm.make_cache(), max_tokens=64):
            out.append(step.token)
            if until is not None and step.token != until[len(out) - 1]:
                break  # the first divergence is all the check needs
        return out

    ids = packed.tokenizer.encode("The history of computing is a story of abstraction layered on abstraction. "
                                  "Early machines were")
    a = greedy(packed, ids)
    b = greedy(floats, ids, until=a)
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        return
    assert i >= 16
    seq = mx.array([ids + b[:i]])
    la, lb = packed.model(seq)[0, -1], floats.model(seq)[0, -1]
    spread = float(mx.abs(la - lb).max().item())
    assert spread < 1.0
    assert float(lb[b[i]] - lb[a[i]]) <= spread, "the paths part on a token that is not a near-tie"
