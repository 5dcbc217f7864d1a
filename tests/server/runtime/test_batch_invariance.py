"""A request's tokens and numbers never depend on what runs beside it, on a backend whose batched
forwards change a row's bits (runtime/invariance.py): in process, on the tiny float checkpoint with
float32 weights on MLX's matmul over OpenBLAS (``MLXCEL_FLOAT_KERNEL=0``), whose sgemm rounds a row by
the matrix's height. The start-up probe finds it, every row then forwards alone, and requests run
together give, bit for bit (token probabilities included), what each gives alone: plain, greedy and
seeded, and prompt lookup. With the probe's answer overridden (``MLXCEL_BATCH_INVARIANT=off``) the same
requests together do change, which is what the check is for. On mlxcel's fused CPU ops the check is
not needed (a row's bits hold by construction) and rows batch."""

from __future__ import annotations

import pytest
import tiny_gguf
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.exactness_probe import batch_invariant
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.speculation import Speculation
from mlxcel.server.runtime.speculation_settings import resolve
from mlxcel.server.runtime.task import Failed, Final, GenerationOptions, Task

PROMPTS = ["a b c a b c a b c a b", "the cat sat. the cat sat. the", "1 2 3 1 2 3 1 2", "x y x y x y x y x"]
SAMPLERS = [SamplerParams(temperature=0.0, ignore_eos=True), SamplerParams(temperature=0.9, ignore_eos=True),
            SamplerParams(temperature=0.0, ignore_eos=True), SamplerParams(temperature=1.1, ignore_eos=True)]


@pytest.fixture(scope="module")
def blas_model(tiny_llama_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLXCEL_FLOAT_KERNEL", "0")  # float32 on MLX's matmul: OpenBLAS sgemm (the test runs with-blas)
        yield load_model(tiny_llama_dir)


@pytest.fixture(scope="module")
def q8(tiny_llama_dir, checkpoints_root):
    return load_model(tiny_gguf.write_gguf(tiny_llama_dir, checkpoints_root / "invariance-q8.gguf",
                                           tiny_gguf.uniform(Q.Q8_0)))


def tasks(lm, n_probs=3, n_predict=12):
    out = []
    for i, (prompt, params) in enumerate(zip(PROMPTS, SAMPLERS)):
        events: list = []
        opts = GenerationOptions(sampler=params, seed=100 + i, n_predict=n_predict, return_tokens=True,
                                 cache_prompt=False, n_probs=n_probs)
        task = Task(prompt_tokens=lm.tokenizer.encode(prompt), options=opts, sink=events.append)
        task.events = events  # type: ignore[attr-defined]
        out.append(task)
    return out


def run(scheduler, batch):
    for task in batch:
        scheduler.submit(task)  # all before the first iteration: they run together
    for _ in range(500):
        if all(any(isinstance(e, Final | Failed) for e in t.events) for t in batch):
            return [t.events[-1].result for t in batch]
        scheduler._iteration()
    raise AssertionError("the tasks did not finish")


def summary(result):
    return result.tokens, [(p.id, p.value, list(p.top)) for p in result.probs]


def alone_and_together(lm, speculation=None, n_probs=3):
    """Each request's result alone (a scheduler of its own), and all of them run together."""
    alone = [run(Scheduler(lm, n_slots=4, speculation=speculation), [t])[0] for t in tasks(lm, n_probs)]
    together = run(Scheduler(lm, n_slots=4, speculation=speculation), tasks(lm, n_probs))
    return alone, together


def test_the_probe_tells_a_batch_dependent_backend_from_a_batch_invariant_one(blas_model, q8):
    for ragged in (False, True):
        assert not batch_invariant(blas_model.model, vocab_size=blas_model.vocab_size, ragged=ragged,
                                   make_cache=blas_model.make_cache)
        assert batch_invariant(q8.model, vocab_size=q8.vocab_size, ragged=ragged, make_cache=q8.make_cache)


def test_requests_together_equal_each_alone_where_batches_change_a_rows_bits(blas_model):
    scheduler = Scheduler(blas_model, n_slots=4)
    assert scheduler.steps.rows_alone
    alone, together = alone_and_together(blas_model)
    assert [summary(r) for r in together] == [summary(r) for r in alone]


def test_without_the_check_the_same_requests_together_change(blas_model, monkeypatch):
    monkeypatch.setenv("MLXCEL_BATCH_INVARIANT", "off")
    assert not Scheduler(blas_model, n_slots=4).steps.rows_alone
    alone, together = alone_and_together(blas_model)
    # the numbers of some request moved with its neighbours
    assert [summary(r) for r in together] != [summary(r) for r in alone]


def test_prompt_lookup_rows_together_equal_each_alone_there_too(blas_model):
    lookup = Speculation.load(resolve(ServerConfig(spec_type="ngram-simple", spec_ngram_simple_size_m=4)), blas_model,
                              measure_cost=False)
    scheduler = Scheduler(blas_model, n_slots=4, speculation=lookup)
    assert scheduler.steps.rows_alone and scheduler.steps.caps.cost is None
    alone, together = alone_and_together(blas_model, speculation=lookup, n_probs=0)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert sum(r.timings.draft.accepted for r in together if r.timings.draft is not None) > 0  # it did draft


def test_on_the_fused_cpu_ops_rows_still_batch(q8):
    assert not Scheduler(q8, n_slots=4).steps.rows_alone
