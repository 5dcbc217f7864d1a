"""The scheduler's batched decode step and shared verify step draw every row in one pass
(batch_select.select_draws, decide.decide_rounds, as engine.decode.step.run_step calls them), in process on a tiny real checkpoint: each
call carries every row of its step, and every row's token (every row's round) is the one its own
per-row path gives, on the scheduler's real rows: greedy, seeded sampling, penalties, a grammar,
prompt lookup's verify rounds; a row whose sampling fails fails alone."""

from __future__ import annotations

import pytest

from mlxcel.engine.decode import step as step_module
from mlxcel.engine.sampling.grammar import GBNF, compile_grammar
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.decide import decide_one
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.reasoning_budget import BudgetSpec
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.speculation import Speculation
from mlxcel.server.runtime.speculation_settings import resolve
from mlxcel.server.runtime.task import Failed, Final, GenerationOptions, Task

PROMPTS = ["a b c a b c a b c a b", "the cat sat. the cat sat. the", "1 2 3 1 2 3 1 2", "x y x y x y x y x",
           "one two one two one two", "red blue red blue red"]
SAMPLERS = [
    SamplerParams(temperature=0.0),
    SamplerParams(temperature=0.9),
    SamplerParams(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0),
    SamplerParams(temperature=0.7, repeat_penalty=1.3, presence_penalty=0.5, repeat_last_n=16),
    SamplerParams(temperature=0.0, frequency_penalty=0.4),
    SamplerParams(temperature=0.8, dry_multiplier=0.8),
]


def budget(lm) -> BudgetSpec:
    """Thinking already open (the start tag in the prompt), two tokens of budget, then ``q`` and the
    end tag ``z`` forced."""
    start, end, message = (lm.tokenizer.encode(t)[-1] for t in ("a", "z", "q"))
    return BudgetSpec(tokens=2, start=(start,), ends=((end,),), forced=(message, end), prefill=(start,))


def tasks(lm, grammar_at=(), n_predict=10, budget_at=()):
    out = []
    grammar = compile_grammar(GBNF, 'root ::= ("a" | "b" | " ")+')
    for i, (prompt, params) in enumerate(zip(PROMPTS, SAMPLERS)):
        events: list = []
        opts = GenerationOptions(sampler=params, seed=100 + i, n_predict=n_predict, return_tokens=True,
                                 cache_prompt=False, grammar=grammar if i in grammar_at else None,
                                 reasoning_budget=budget(lm) if i in budget_at else None)
        out.append(Task(prompt_tokens=lm.tokenizer.encode(prompt), options=opts, sink=events.append))
        out[-1].events = events  # type: ignore[attr-defined]
    return out


def run_all(scheduler, batch):
    for task in batch:
        scheduler.submit(task)
    for _ in range(500):
        if all(any(isinstance(e, Final | Failed) for e in t.events) for t in batch):
            return
        scheduler._iteration()
    raise AssertionError("the tasks did not finish")


def spy_draws(monkeypatch):
    """Every select_draws call's width, each row checked against its own SamplerChain.select."""
    widths = []
    real = step_module.select_draws

    def spy(draws):
        got = real(draws)
        widths.append(len(draws))
        for d, tokens in zip(draws, got):
            assert tokens == d.chain.select(d.logits, d.history, d.appended, d.seed, d.first_position, d.allowed)
        return got

    monkeypatch.setattr(step_module, "select_draws", spy)
    return widths


def test_the_decode_step_draws_every_row_in_one_call_each_as_alone(tiny_llama, monkeypatch):
    widths = spy_draws(monkeypatch)
    scheduler = Scheduler(tiny_llama, n_slots=6)
    batch = tasks(tiny_llama, grammar_at=(0, 1), budget_at=(2,))
    run_all(scheduler, batch)
    assert all(isinstance(t.events[-1], Final) for t in batch)
    spec = budget(tiny_llama)
    assert batch[2].events[-1].result.tokens[2:4] == list(spec.forced)  # forced in the middle of batched steps
    assert max(widths) == len(batch)  # one call carried every decoding row
    assert sum(widths) >= len(batch) * 8  # and every decoded token went through it


def test_a_row_whose_draw_fails_fails_alone(tiny_llama, monkeypatch):
    real = step_module.select_draws

    def failing(draws):
        got = real(draws)
        return [RuntimeError("boom") if d.seed == 101 else g for d, g in zip(draws, got)]

    monkeypatch.setattr(step_module, "select_draws", failing)
    scheduler = Scheduler(tiny_llama, n_slots=6)
    batch = tasks(tiny_llama)
    run_all(scheduler, batch)
    assert isinstance(batch[1].events[-1], Failed)
    assert all(isinstance(t.events[-1], Final) for i, t in enumerate(batch) if i != 1)
    assert not any(s.busy for s in scheduler.slots)


@pytest.fixture(scope="module")
def lookup(tiny_llama):
    settings = resolve(ServerConfig(spec_type="ngram-simple", spec_ngram_simple_size_m=4))
    return Speculation.load(settings, tiny_llama, measure_cost=False)


def test_the_verify_step_decides_every_row_in_one_call_each_as_alone(tiny_llama, lookup, monkeypatch):
    widths = []
    real = step_module.decide_rounds

    def spy(rows):
        expected = [decide_one(row) for row in rows]
        got = real(rows)
        widths.append(len(rows))
        for e, g in zip(expected, got):
            assert (g.emitted, g.accepted, g.tested, g.proposed) == (e.emitted, e.accepted, e.tested, e.proposed)
        return got

    monkeypatch.setattr(step_module, "decide_rounds", spy)
    scheduler = Scheduler(tiny_llama, n_slots=6, speculation=lookup)
    batch = tasks(tiny_llama, grammar_at=(1,), n_predict=16)
    run_all(scheduler, batch)
    assert all(isinstance(t.events[-1], Final) for t in batch)
    assert max(widths) == len(batch)
    drafted = [t.events[-1].result.timings.draft for t in batch]
    assert sum(d.proposed for d in drafted if d is not None) > 0 and sum(d.accepted for d in drafted if d) > 0
