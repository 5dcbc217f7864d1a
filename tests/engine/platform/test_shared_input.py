"""One product for the projections that read the same input (``packed_modules.share_inputs``):
``qmatmul_multi`` gives each matrix bitwise what its own ``qmatmul`` gives, whatever the types
mixed, the rows, the threads and the ISA; a packed model's q/k/v and gate/up are joined, and the
modules called one by one (as mlx-lm and ``engine/cache/ragged.py`` call them) return the same
bits as without the join."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import tiny_gguf
from gguf import GGMLQuantizationType as Q
from quant_blocks import random_blocks
from test_qmatmul import isas

from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform import packed_modules, qmatmul
from mlxcel.engine.platform.packed_modules import PackedLinear

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")


@pytest.fixture
def ext():
    e = qmatmul.extension()
    isa, threads = e.isa(), e.num_threads()
    split = qmatmul.set_thread_split(1, 0)  # every call split among the threads, as finely as it goes
    yield e
    qmatmul.set_thread_split(*split)
    e.set_isa(isa)
    e.set_num_threads(threads)


def test_multi_is_each_product_bitwise(ext):
    k = 512
    ws = [qmatmul.pack_gguf(random_blocks(t, n, k, seed=i), int(t), n, k)
          for i, (t, n) in enumerate([(Q.Q4_K, 70), (Q.Q6_K, 32), (Q.Q4_1, 300), (Q.Q8_0, 16)])]
    x = mx.array(np.random.default_rng(3).standard_normal((40, k)).astype(np.float32))
    for isa in isas():
        ext.set_isa(isa)
        for threads in (1, 2):
            ext.set_num_threads(threads)
            for m in (1, 2, 5, 16, 40):
                outs = qmatmul.qmatmul_multi(x[:m], ws)
                for w, y in zip(ws, outs, strict=True):
                    assert y.shape == (m, w.n)
                    assert mx.array_equal(y, qmatmul.qmatmul(x[:m], w)), (isa, threads, m, w.qtype)
    # strided rows (a transposed view) and bfloat16 inputs go the same way as qmatmul's
    xt = mx.array(np.random.default_rng(4).standard_normal((k, 6)).astype(np.float32)).T
    for xin in (xt, xt.astype(mx.bfloat16)):
        for w, y in zip(ws, qmatmul.qmatmul_multi(xin, ws), strict=True):
            assert mx.array_equal(y, qmatmul.qmatmul(xin, w))


@pytest.fixture(scope="module")
def packed_qwen(tmp_path_factory, tiny_qwen_dir):
    # mixed types inside a group (v in another type, as Q4_K_M files have it) and q/k/v biases
    # (qwen2); the tiny model's 64 features are too few for K-quant blocks
    path = tiny_gguf.write_gguf(tiny_qwen_dir, tmp_path_factory.mktemp("shared") / "q.gguf",
                                tiny_gguf.mixed({"token_embd": Q.Q8_0, "attn_v": Q.Q8_0, "": Q.Q4_1}))
    return load_model(path)


def test_model_projections_are_joined_and_exact(packed_qwen):
    layers = packed_qwen.model.model.layers
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert attn.q_proj._shared is not None and attn.q_proj._shared is attn.v_proj._shared
        assert mlp.gate_proj._shared is mlp.up_proj._shared is not None
        assert attn.o_proj._shared is None and mlp.down_proj._shared is None
    attn = layers[0].self_attn
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    x = mx.random.normal((1, 7, attn.q_proj._spec[3]), key=mx.random.key(0))
    for order in ((0, 1, 2), (2, 0, 1)):
        got = {i: projections[i](x) for i in order}
        for i, p in enumerate(projections):
            alone = packed_modules.product(x, p.weight_spec) + p.bias
            assert mx.array_equal(got[i], alone), (order, i)
        assert attn.q_proj._shared._x is None  # nothing kept once every member took its output
    # a member called twice with the same array, or with another array, computes afresh
    y1, y2 = attn.q_proj(x), attn.q_proj(x)
    assert mx.array_equal(y1, y2)
    x2 = x + 1
    assert mx.array_equal(attn.k_proj(x2), packed_modules.product(x2, attn.k_proj.weight_spec) + attn.k_proj.bias)


def test_joined_forward_matches_the_unjoined_one(packed_qwen):
    model = packed_qwen.model
    members = [m for _, m in model.named_modules() if isinstance(m, PackedLinear) and m._shared is not None]
    tokens = mx.array([[1, 5, 9, 2, 7, 3]])
    joined = model(tokens, cache=packed_qwen.make_cache())
    groups = [m._shared for m in members]
    try:
        for m in members:
            m._shared = None
        alone = model(tokens, cache=packed_qwen.make_cache())
    finally:
        for m, g in zip(members, groups, strict=True):
            m._shared = g
    assert mx.array_equal(joined, alone)


def test_a_joined_model_frees_by_reference_counting(packed_qwen):
    """The join holds its members weakly: no cycle, so a dropped model (``--sleep-idle-seconds``,
    with the heap frozen after loading) frees at once."""
    import gc
    import weakref

    lm = load_model(packed_qwen.path)
    assert lm.model.model.layers[0].self_attn.q_proj._shared is not None
    ref = weakref.ref(lm.model)
    gc.disable()
    try:
        del lm
        assert ref() is None
    finally:
        gc.enable()
