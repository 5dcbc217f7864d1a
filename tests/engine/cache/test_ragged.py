"""The ragged batch (engine.cache.ragged) on a tiny real checkpoint: rows of different lengths and
widths in one forward, each row's own rewind, and rows out again as single-sequence caches."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
import tiny_gguf
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.cache import ragged
from mlxcel.engine.cache.batch import forward_chunk
from mlxcel.engine.cache.kv_cache import rewind
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan, joinable
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform.ragged_ops import runs_fused
from mlxcel.engine.platform.settings import switched

rng = random.Random(0)
CONTEXTS = [[rng.randrange(300) for _ in range(n)] for n in (5, 17, 9)]
BLOCKS = [[rng.randrange(300) for _ in range(n)] for n in (1, 4, 3)]


@pytest.fixture(scope="module")
def q8(tiny_llama_dir, checkpoints_root):
    # packed CPU kernels (a real GGUF's path here): rows round the same in any batch
    return load_model(tiny_gguf.write_gguf(tiny_llama_dir, checkpoints_root / "ragged-q8.gguf",
                                           tiny_gguf.uniform(Q.Q8_0)))


@pytest.fixture(scope="module")
def unfused(tiny_llama_dir):
    # the float checkpoint on MLX's own matmul and attention (the float kernel off): the masked,
    # padded path of the ragged forward
    with switched(float_kernel=False):
        return load_model(tiny_llama_dir)


def prefilled(lm, context):
    cache = lm.make_cache()
    lm.model(mx.array([context]), cache=cache)
    return cache


def batch_of(lm, rows):
    batch = RaggedBatch(lm.model)
    for i in rows:
        batch.add(i, prefilled(lm, CONTEXTS[i]))
    return batch


def step(batch, blocks):
    plan = StepPlan()
    for row, block in zip(batch.rows, blocks):
        plan.add(row, block, batch.length(row))
    logits = batch.forward(plan)
    mx.eval(logits)
    return logits, plan


@pytest.mark.parametrize("which", ["q8", "float"])
def test_each_row_of_a_ragged_forward_is_bitwise_what_it_is_alone(which, q8, tiny_llama):
    lm = q8 if which == "q8" else tiny_llama  # float: float32 tiles, exact per row too
    together, plan = step(batch_of(lm, [0, 1, 2]), BLOCKS)
    assert plan.width == 4 and plan.n_tokens == 8 and plan.positions == [5, 17, 9]
    for i, block in enumerate(BLOCKS):
        alone, _ = step(batch_of(lm, [i]), [block])
        assert alone[0].shape[0] == len(block)
        assert mx.array_equal(alone[0], together[i]).item(), i


def test_rows_keep_or_drop_their_own_tails(q8, tiny_llama, unfused):
    for lm, exact in ((q8, True), (tiny_llama, True), (unfused, False)):
        batch = batch_of(lm, [0, 1, 2])
        step(batch, BLOCKS)
        batch.rewind(1, 3)  # row 1 keeps one of its four, the others keep all
        batch.rewind(2, 0)
        logits, _ = step(batch, [[7], [8], [9]])
        for i, (keep, nxt) in enumerate(((1, 7), (1, 8), (3, 9))):
            ref = prefilled(lm, CONTEXTS[i])
            lm.model(mx.array([BLOCKS[i]]), cache=ref)
            rewind(ref, len(BLOCKS[i]) - keep)
            want = lm.model(mx.array([[nxt]]), cache=ref)[0, -1]
            got = logits[i][0]
            if exact:
                assert batch.length(i) == ref[0].offset
            # the single-sequence path takes other kernels (one-token matmul, fused attention): equal to rounding
            assert mx.abs(want - got).max().item() < 1e-3 and want.argmax().item() == got.argmax().item()
        out = batch.remove([1])[1]
        assert joinable(out) and out[0].offset == len(CONTEXTS[1]) + 1 + 1
        assert batch.rows == [0, 2] and len(batch) == 2
        step(batch, [[1, 2], [3]])  # the others go on without it


def test_a_plan_must_name_every_row_in_order(q8):
    batch = batch_of(q8, [0, 1])
    plan = StepPlan()
    plan.add(1, [3], batch.length(1))
    plan.add(0, [3], batch.length(0))
    with pytest.raises(ValueError):
        batch.forward(plan)
    with pytest.raises(ValueError):
        batch.rewind(0, 100)


def test_the_fused_ragged_attention_is_what_the_packed_model_runs(q8, tiny_llama, unfused):
    # a float checkpoint runs packed too (float32 tiles) unless the float kernel is off
    assert runs_fused(q8.model) and runs_fused(tiny_llama.model) and not runs_fused(unfused.model)


@pytest.mark.parametrize("beside", [True, False])
def test_prompts_prefilled_as_rows_are_bitwise_the_single_sequence_prefill(q8, beside):
    # a row joins empty, another with a reused 3-token prefix; both feed 16-token prompt chunks (beside
    # a decoding row, or alone: forwards that want no logits at all) and ask for their last position's
    # logits only: the logits and the caches are the bits of the single-sequence prefill (same chunks)
    prompts = {"a": [rng.randrange(300) for _ in range(37)], "b": [rng.randrange(300) for _ in range(20)]}
    reused = {"a": 0, "b": 3}
    batch = RaggedBatch(q8.model)
    batch.add("a", q8.make_cache())
    batch.add("b", prefilled(q8, prompts["b"][:3]))
    if beside:
        batch.add("c", prefilled(q8, CONTEXTS[0]))
    done, got = dict(reused), {}
    while any(done[r] < len(p) for r, p in prompts.items()):
        plan = StepPlan()
        for row, prompt in prompts.items():
            chunk = prompt[done[row]:done[row] + 16] or [7]  # a finished prompt decodes on
            plan.add(row, chunk, batch.length(row), logits=1 if done[row] + len(chunk) >= len(prompt) else 0)
        if beside:
            plan.add("c", [5], batch.length("c"))
        logits = batch.forward(plan)
        mx.eval([x for x in logits if x is not None])
        for row, out, chunk in zip(plan.rows, logits, plan.tokens):
            if row in done and done[row] < len(prompts[row]):
                done[row] += len(chunk)
                assert (out is None) == (done[row] < len(prompts[row]))
                if out is not None:
                    assert out.shape[0] == 1
                    got[row] = out[0]
    for row, prompt in prompts.items():
        cache = prefilled(q8, prompt[:reused[row]]) if reused[row] else q8.make_cache()
        for at in range(reused[row], len(prompt), 16):
            want = forward_chunk(q8.model, prompt[at:at + 16], cache)
        assert mx.array_equal(want, got[row]).item(), row
        n = len(prompt)
        out = batch.remove([row])[row]
        assert out[0].offset >= n
        for mine, ref in zip(out, cache):
            assert mx.array_equal(mine.keys[..., :n, :], ref.keys[..., :n, :]).item(), row
            assert mx.array_equal(mine.values[..., :n, :], ref.values[..., :n, :]).item(), row


def test_rows_leave_and_join_in_freed_places_without_touching_the_others(q8):
    batch = RaggedBatch(q8.model, places=2)
    for i in (0, 1):
        batch.add(i, prefilled(q8, CONTEXTS[i]))
    step(batch, [[3, 4], [5]])
    out = batch.remove([0])[0]  # its place is free; row 2 takes it, row 3 needs a new one
    batch.add(2, prefilled(q8, CONTEXTS[2]))
    batch.add(3, out)
    assert sorted(batch.cache[0].places) == [0, 1, 2]
    together, _ = step(batch, [[6], [7, 8], [9, 1, 2]])
    # each row alone, through the same forwards: the same bits
    for row, context, history in ((1, CONTEXTS[1], [[5], [6]]), (2, CONTEXTS[2], [[7, 8]]),
                                  (3, CONTEXTS[0], [[3, 4], [9, 1, 2]])):
        alone = RaggedBatch(q8.model)
        alone.add(row, prefilled(q8, context))
        for block in history:
            got, _ = step(alone, [block])
        assert mx.array_equal(got[0], together[batch.rows.index(row)]).item(), row
    mine = batch.remove([3])[3]
    assert all(mx.array_equal(a.keys[..., :a.offset, :], b.keys[..., :a.offset, :]).item()
               for a, b in zip(out, mine))


def test_an_emptied_batch_keeps_its_places_for_the_next_rows(q8, monkeypatch):
    """When the last rows leave, a small batch keeps its keys and values, so that a burst of rows joins
    existing places (no doubling); rows joining them get the bits a fresh batch gives. Over the size
    limit the arrays are dropped as before."""
    batch = batch_of(q8, [0, 1, 2])
    step(batch, BLOCKS)
    places = batch.cache[0].keys.shape[0]
    batch.remove([0, 1, 2])
    assert len(batch) == 0 and batch.cache is not None and batch.cache[0].keys.shape[0] == places
    keys = batch.cache[0].keys
    for i in (2, 1, 0):  # another order: the places are reused, not grown
        batch.add(i, prefilled(q8, CONTEXTS[i]))
    assert batch.cache[0].keys.shape[0] == places
    assert sorted(batch.cache[0].places) == [0, 1, 2]
    again, _ = step(batch, BLOCKS[::-1])
    fresh = batch_of(q8, [2, 1, 0])
    want, _ = step(fresh, BLOCKS[::-1])
    assert all(mx.array_equal(a, b).item() for a, b in zip(again, want))
    assert keys.shape == batch.cache[0].keys.shape  # the same layout as before the rows left
    monkeypatch.setattr(ragged, "RETAIN_EMPTY_BYTES", 0)
    batch.remove([0, 1, 2])
    assert batch.cache is None


@pytest.mark.parametrize("which", ["q8", "float"])
def test_a_step_over_lazy_tokens_is_bitwise_the_planned_forward(which, q8, tiny_llama, unfused):
    # RaggedBatch.step (the scheduler's pipelined plain steps) takes the rows' tokens as a lazy array;
    # its logits and caches are the bits of the forward of the same tokens given as a plan, one row
    # alone included (on the fused ops a lone token is not padded to two)
    lm = q8 if which == "q8" else tiny_llama
    for rows in ([1], [0, 1, 2]):
        planned, lazy = batch_of(lm, rows), batch_of(lm, rows)
        tokens = [3 + r for r in rows]
        for _ in range(3):
            want, _ = step(planned, [[t] for t in tokens])
            ids = mx.argmax(mx.array([[0.0] * 300 for _ in rows]), axis=-1) + mx.array(tokens)  # lazy
            got = lazy.step(ids.astype(mx.int32))
            mx.eval(got)
            for j in range(len(rows)):
                assert mx.array_equal(want[j][0], got[j]).item(), (rows, j)
            tokens = [int(x[0].argmax().item()) for x in want]
        for r in rows:
            assert planned.length(r) == lazy.length(r)
    with pytest.raises(ValueError):
        batch_of(unfused, [0]).step(mx.array([3], dtype=mx.int32))  # not on the fused ops
