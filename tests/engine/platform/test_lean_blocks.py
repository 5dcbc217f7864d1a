"""The lean decoder blocks (``lean_blocks.py``) build the same graph as mlx-lm's blocks over the
packed / fused modules: logits bitwise the same for a prefill, greedy one-token steps and a block
forward, on llama and on qwen2 (q/k/v biases, mixed types in a group); what they do not cover
(a batch cache's per-row offsets, a model without the fused ops) goes to mlx-lm's code."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import BatchKVCache

from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.lean_blocks import LeanBlock

pytestmark = pytest.mark.skipif(not (qmatmul.available() and qmatmul.has_multi()),
                                reason="the CPU kernels are not built here")


@pytest.fixture
def packed(packed_mixed):
    return packed_mixed


def _blocks(lm) -> list:
    return [m for _, m in lm.model.named_modules() if isinstance(m, LeanBlock)]


def _run(lm) -> list[mx.array]:
    """Logits of a 7-token prefill, 12 greedy one-token steps and a 4-token block."""
    cache = lm.make_cache()
    outs = [lm.model(mx.array([[1, 5, 9, 2, 7, 3, 4]]), cache=cache)]
    for _ in range(12):
        outs.append(lm.model(mx.argmax(outs[-1][:, -1], axis=-1)[:, None], cache=cache))
    outs.append(lm.model(mx.array([[6, 2, 8, 1]]), cache=cache))
    mx.eval(outs)
    return outs


def _without_plans(lm, fn):
    blocks = _blocks(lm)
    plans = [b._plan for b in blocks]
    try:
        for b in blocks:
            object.__setattr__(b, "_plan", None)  # every call goes to mlx-lm's __call__
        return fn()
    finally:
        for b, p in zip(blocks, plans, strict=True):
            object.__setattr__(b, "_plan", p)


def test_every_block_is_lean_and_the_parameters_are_unchanged(packed):
    blocks = _blocks(packed)
    assert len(blocks) == len(packed.model.layers) and all(b._plan is not None for b in blocks)
    names = [n for n, _ in tree_flatten(packed.model.parameters())]
    assert not any("_plan" in n for n in names)
    assert all(".packed" in n or "norm" in n or "bias" in n for n in names)


def test_lean_logits_are_mlx_lm_blocks_bitwise(packed):
    lean = _run(packed)
    plain = _without_plans(packed, lambda: _run(packed))
    for i, (a, b) in enumerate(zip(lean, plain, strict=True)):
        assert mx.array_equal(a, b), i
    # and the comparison can fail: a plan with another rope base is seen
    block = _blocks(packed)[0]
    plan = block._plan
    dims, traditional, base, scale = plan.rope
    try:
        object.__setattr__(block, "_plan", plan._replace(rope=(dims, traditional, base * 2, scale)))
        assert not any(mx.array_equal(a, b) for a, b in zip(_run(packed), plain, strict=True))
    finally:
        object.__setattr__(block, "_plan", plan)


def test_a_batch_cache_goes_to_mlx_lm(packed):
    tokens = mx.array([[1, 5, 9, 2], [0, 3, 7, 4]])

    def batch():
        cache = [BatchKVCache(left_padding=[0, 1]) for _ in packed.model.layers]
        y = packed.model(tokens, cache=cache)
        z = packed.model(mx.array([[2], [6]]), cache=cache)
        mx.eval(y, z)
        return y, z

    for a, b in zip(batch(), _without_plans(packed, batch), strict=True):
        assert mx.array_equal(a, b)


def test_without_the_fused_ops_no_block_is_lean(packed, monkeypatch):
    assert _blocks(packed)
    monkeypatch.setenv("MLXCEL_FUSED_OPS", "0")
    assert not _blocks(load_model(packed.path))
