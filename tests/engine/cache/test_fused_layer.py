"""The ragged forward's decoder layers as the extension's two layer primitives
(``qmatmul_src/layer.h``, ``ragged._fused_layer``) give every row the bits of the layer's separate
primitives (``MLXCEL_FUSED_LAYER=0``): logits and kept caches, on llama and on qwen2 (q/k/v
biases, mixed types in a group), at one and two kernel threads with every call split; bad shapes
are refused."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxcel.engine.cache import ragged
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan
from mlxcel.engine.platform import qmatmul

pytestmark = pytest.mark.skipif(not (qmatmul.available() and hasattr(qmatmul.extension(), "cache_write")),
                                reason="the CPU kernels are not built here")

CONTEXTS = [[3, 9, 4, 1, 7], [2, 8, 8, 5, 6, 1, 9, 4, 3, 2, 7], []]  # the last row joins empty: a prompt


@pytest.fixture
def packed(packed_mixed):
    return packed_mixed


@pytest.fixture(params=[1, 2])
def threads(request):
    ext = qmatmul.extension()
    before, split = ext.num_threads(), qmatmul.set_thread_split(1, 0)  # every call split among the threads
    ext.set_num_threads(request.param)
    yield request.param
    qmatmul.set_thread_split(*split)
    ext.set_num_threads(before)


def _run(lm, fused: bool, monkeypatch) -> tuple[list[mx.array], list, int]:
    """Logits of a ragged forward (a 4-token verify block, one token, a 6-token prompt), three lazy
    steps of all three rows, then a rewind and a 3-token block; the kept caches; fused layer calls."""
    calls = [0]
    real = ragged._fused_layer

    def counted(*args):
        calls[0] += 1
        return real(*args)

    monkeypatch.setenv("MLXCEL_FUSED_LAYER", "1" if fused else "0")
    monkeypatch.setattr(ragged, "_fused_layer", counted)
    batch = RaggedBatch(lm.model)
    for i, context in enumerate(CONTEXTS):
        cache = lm.make_cache()
        if context:
            lm.model(mx.array([context]), cache=cache)
        batch.add(i, cache)
    outs = []
    plan = StepPlan()
    for row, block in zip(batch.rows, ([5, 2, 7, 1], [4], [1, 6, 2, 9, 3, 8])):
        plan.add(row, block, batch.length(row), len(block))
    outs += batch.forward(plan)
    for ids in ([3, 1, 4], [1, 5, 9], [2, 6, 5]):
        outs.append(batch.step(mx.array(ids, dtype=mx.int32)))
    batch.rewind(0, 2)
    plan = StepPlan()
    for row, block in zip(batch.rows, ([8, 8, 1], [2], [7])):
        plan.add(row, block, batch.length(row), len(block))
    outs += batch.forward(plan)
    mx.eval(outs)
    kept = batch.remove(list(batch.rows))
    return outs, kept, calls[0]


def test_the_layer_primitives_give_each_row_the_separate_primitives_bits(packed, threads, monkeypatch):
    want, want_kept, none = _run(packed, False, monkeypatch)
    got, got_kept, calls = _run(packed, True, monkeypatch)
    layers = len(packed.model.model.layers)
    assert none == 0 and calls == 5 * layers  # the comparison is between the two paths
    assert len(want) == len(got)
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert a.shape == b.shape and mx.array_equal(a, b).item(), i
    for row in want_kept:
        for a, b in zip(want_kept[row], got_kept[row], strict=True):
            assert a.offset == b.offset and mx.array_equal(a.keys, b.keys).item() \
                and mx.array_equal(a.values, b.values).item(), row


def _plan_args(lm):
    plan = lm.model.model.layers[0]._plan
    assert plan is not None
    return plan


def test_a_different_norm_epsilon_changes_the_bits(packed):
    # the comparison above can fail: the layer's own arithmetic shows in the output's bits
    plan = _plan_args(packed)
    ext = plan.ext
    h = mx.random.normal((1, 3, plan.norm1.shape[0]), key=mx.random.key(0))
    pos = mx.array([0, 1, 2], dtype=mx.int32)

    def q_of(eps):
        return ext.layer_in(h, plan.norm1, eps, *plan.qkv[:4], list(plan.qkv_bias or ()), pos, plan.n_heads,
                            plan.n_kv_heads, *plan.rope)[0]

    assert mx.array_equal(q_of(plan.eps1), q_of(plan.eps1)).item()
    assert not mx.array_equal(q_of(plan.eps1), q_of(plan.eps1 * 1000 + 1e-3)).item()


def test_bad_shapes_are_refused(packed):
    plan = _plan_args(packed)
    ext = plan.ext
    k = plan.norm1.shape[0]
    h = mx.zeros((1, 3, k))
    with pytest.raises(ValueError, match="positions"):
        ext.layer_in(h, plan.norm1, plan.eps1, *plan.qkv[:4], [], mx.array([0, 1], dtype=mx.int32), plan.n_heads,
                     plan.n_kv_heads, *plan.rope)
    with pytest.raises(ValueError, match="head"):
        ext.layer_in(h, plan.norm1, plan.eps1, *plan.qkv[:4], [], mx.array([0, 1, 2], dtype=mx.int32),
                     plan.n_heads + 1, plan.n_kv_heads, *plan.rope)
    with pytest.raises(ValueError, match="biases"):
        ext.layer_in(h, plan.norm1, plan.eps1, *plan.qkv[:4], [plan.norm1], mx.array([0, 1, 2], dtype=mx.int32),
                     plan.n_heads, plan.n_kv_heads, *plan.rope)


def test_a_cache_write_of_the_wrong_shape_is_refused(packed):
    ext = _plan_args(packed).ext
    cache = mx.zeros((2, 8, 2, 4))
    k = mx.zeros((3, 2, 4))
    rows, pos = mx.array([0, 1, 1], dtype=mx.int32), mx.array([0, 0, 1], dtype=mx.int32)
    keys, values = ext.cache_write(cache, cache, rows, pos, k + 1, k + 2)
    assert keys[1, 1].tolist() == [[1.0] * 4] * 2 and values[0, 0].tolist() == [[2.0] * 4] * 2
    assert keys[0, 1].tolist() == [[0.0] * 4] * 2
    with pytest.raises(ValueError, match="cache_write"):
        ext.cache_write(cache, cache, rows, pos, mx.zeros((3, 3, 4)), mx.zeros((3, 3, 4)))
    with pytest.raises(ValueError, match="positions"):
        ext.cache_write(cache, cache, rows, pos[:2], k, k)
