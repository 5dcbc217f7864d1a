"""Pipelined plain decode steps (runtime/run_ahead.py), in process on a tiny packed checkpoint (the
fused CPU ops, where the scheduler runs them): the next step is queued before the tokens are read
back, and every request's tokens, text, stop reason and kept cache are the ones it gets without the
pipeline: greedy, seeded sampling, penalties, a stop string, EOS, n_predict, alone and together, a
request that joins while others decode, a cancelled one."""

from __future__ import annotations

import pytest
import tiny_gguf
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.cache.ragged import RaggedBatch
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.speculation import Speculation
from mlxcel.server.runtime.speculation_settings import resolve
from mlxcel.server.runtime.task import Failed, Final, GenerationOptions, Task

PROMPTS = ["a b c a b c a b c a b", "the cat sat. the cat sat. the", "1 2 3 1 2 3 1 2", "x y x y x y x y x"]
SAMPLERS = [
    SamplerParams(temperature=0.0, ignore_eos=True),
    SamplerParams(temperature=0.9, ignore_eos=True),
    SamplerParams(temperature=0.7, repeat_penalty=1.3, presence_penalty=0.5, repeat_last_n=16),
    SamplerParams(temperature=0.0, frequency_penalty=0.4),
]


@pytest.fixture(scope="module")
def q8(tiny_llama_dir, checkpoints_root):
    return load_model(tiny_gguf.write_gguf(tiny_llama_dir, checkpoints_root / "run-ahead-q8.gguf",
                                           tiny_gguf.uniform(Q.Q8_0)))


def make_tasks(lm, n_predict=(12, 9, 16, 7), stop=None):
    out = []
    for i, (prompt, params) in enumerate(zip(PROMPTS, SAMPLERS)):
        events: list = []
        opts = GenerationOptions(sampler=params, seed=100 + i, n_predict=n_predict[i], return_tokens=True,
                                 cache_prompt=True, stop=list(stop[i]) if stop and stop[i] else [])
        task = Task(prompt_tokens=lm.tokenizer.encode(prompt), options=opts, sink=events.append)
        task.events = events  # type: ignore[attr-defined]
        out.append(task)
    return out


def finished(task) -> bool:
    return any(isinstance(e, Final | Failed) for e in task.events)


def run(scheduler, tasks, join_late=()):
    """Submit ``tasks`` (those in ``join_late`` after three iterations) and iterate until all end."""
    for i, task in enumerate(tasks):
        if i not in join_late:
            scheduler.submit(task)
    for n in range(600):
        if all(finished(t) for t in tasks):
            return [t.events[-1].result for t in tasks]
        if n == 3:
            for i in join_late:
                scheduler.submit(tasks[i])
        scheduler._iteration()
    raise AssertionError("the tasks did not finish")


def spy_steps(monkeypatch):
    calls = []
    real = RaggedBatch.step

    def step(self, ids):
        calls.append(len(self.rows))
        return real(self, ids)

    monkeypatch.setattr(RaggedBatch, "step", step)
    return calls


def summary(results):
    return [(r.tokens, r.content, r.stop_type, r.n_predicted) for r in results]


def scheduler_for(lm, run_ahead: bool, n_slots=4, speculation=None) -> Scheduler:
    scheduler = Scheduler(lm, n_slots=n_slots, n_ctx=512, speculation=speculation)
    scheduler.steps.pipeline.enabled = run_ahead
    return scheduler


def check_caches(scheduler):
    for slot in scheduler.slots:
        assert not slot.busy
        if slot.cache is not None:
            assert cache_length(slot.cache) == len(slot.tokens), slot.id


def test_each_request_alone_gets_the_tokens_it_gets_without_the_pipeline(q8, monkeypatch):
    calls = spy_steps(monkeypatch)
    want, got = [], []
    for run_ahead, out in ((False, want), (True, got)):
        scheduler = scheduler_for(q8, run_ahead)
        for task in make_tasks(q8):
            out.append(run(scheduler, [task])[0])
        check_caches(scheduler)
    assert summary(got) == summary(want)
    assert len(calls) >= sum(r.n_predicted for r in got) - 3 * len(got)  # nearly every step pipelined


def test_requests_together_and_joining_late_get_their_own_tokens(q8, monkeypatch):
    calls = spy_steps(monkeypatch)
    alone = [run(scheduler_for(q8, False), [t])[0] for t in make_tasks(q8)]
    together = run(scheduler_for(q8, True), make_tasks(q8))
    late = run(scheduler_for(q8, True), make_tasks(q8), join_late=(1, 3))
    assert summary(together) == summary(alone)
    assert summary(late) == summary(alone)
    assert 4 in calls and calls.count(2) >= 3


def test_stop_strings_eos_and_the_kept_cache_are_the_same(q8):
    # find a word the greedy request produces, so that a stop string ends it mid-stream
    probe = run(scheduler_for(q8, False), make_tasks(q8, n_predict=(24, 24, 24, 24))[:1])[0]
    word = probe.content.split()[len(probe.content.split()) // 2] if probe.content.split() else "a"
    stops = [(word,), None, (word,), None]
    results = {}
    for run_ahead in (False, True):
        scheduler = scheduler_for(q8, run_ahead)
        first = run(scheduler, make_tasks(q8, n_predict=(24, 24, 24, 24), stop=stops))
        again = run(scheduler, make_tasks(q8, n_predict=(24, 24, 24, 24), stop=stops))  # reuses the kept caches
        check_caches(scheduler)
        results[run_ahead] = (summary(first), summary(again), [r.timings.cache_n for r in again])
    assert results[True] == results[False]
    assert results[True][0][0][2] == "word"  # the stop string did end the first request


def test_a_cancelled_request_frees_its_slot_and_the_others_go_on(q8):
    alone = [run(scheduler_for(q8, False), [t])[0] for t in make_tasks(q8)]
    scheduler = scheduler_for(q8, True)
    tasks = make_tasks(q8)
    for task in tasks:
        scheduler.submit(task)
    for _ in range(6):
        scheduler._iteration()
    tasks[2].cancel()
    keep = [t for i, t in enumerate(tasks) if i != 2]
    for _ in range(600):
        if all(finished(t) for t in keep):
            break
        scheduler._iteration()
    scheduler._iteration()
    assert summary([t.events[-1].result for t in keep]) == summary([a for i, a in enumerate(alone) if i != 2])
    check_caches(scheduler)


def test_lookup_rows_with_nothing_drafted_ride_the_pipeline_with_their_own_tokens(q8, monkeypatch):
    """Prompt-lookup rows (greedy and seeded sampler-match, penalties) that draft nothing in an
    iteration decode in the pipelined step (``SpeculativeSession.quiet``); each row's tokens, text,
    stop reason and kept cache equal the same request's alone, and equal those without the pipeline."""
    settings = resolve(ServerConfig(spec_type="ngram-simple", spec_ngram_simple_size_m=4))
    lookup = Speculation.load(settings, q8, measure_cost=False)
    quiet = []
    real = SpeculativeSession.quiet

    def spy(self, prep, sequence, token):
        quiet.append(token)
        return real(self, prep, sequence, token)

    monkeypatch.setattr(SpeculativeSession, "quiet", spy)
    calls = spy_steps(monkeypatch)
    n_predict = (24, 20, 28, 16)
    alone = [run(scheduler_for(q8, False, speculation=lookup), [t])[0] for t in make_tasks(q8, n_predict)]
    plain = [run(scheduler_for(q8, False), [t])[0] for t in make_tasks(q8, n_predict)]
    assert quiet == []  # without the pipeline a round with nothing drafted is decided as any round
    for join_late in ((), (1, 3)):
        scheduler = scheduler_for(q8, True, speculation=lookup)
        together = run(scheduler, make_tasks(q8, n_predict), join_late=join_late)
        check_caches(scheduler)
        assert summary(together) == summary(alone)
    assert summary(alone) == summary(plain)  # lookup never changes the tokens under these rules
    assert quiet and calls  # some rows did ride the pipeline
