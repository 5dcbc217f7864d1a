"""Upstream's n-gram speculative types in the server, on the scheduler's real engine thread loop (in
process, the tiny llama): every type, and several combined, emit the plain server's tokens (greedy, and
sampled under one seed) while really drafting; their --spec-ngram-* parameters reach the drafters; the
n-gram cache a slot keeps outlives its request, and stays that slot's."""

from __future__ import annotations

import pytest

from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.speculation import Speculation
from mlxcel.server.runtime.speculation_settings import resolve
from mlxcel.server.runtime.task import Failed, Final, GenerationOptions, Task

# the tiny model's greedy continuation of it falls into a loop: every type has something to draft
PROMPT = "The quick brown fox jumps over the lazy dog. Hello, world! How are you today?"
N_PREDICT = 40
SMALL = {"spec_ngram_map_k_size_n": 2, "spec_ngram_map_k_size_m": 8, "spec_ngram_map_k4v_size_n": 2,
         "spec_ngram_map_k4v_size_m": 4, "spec_ngram_mod_n_match": 2, "spec_ngram_mod_n_min": 1,
         "spec_ngram_mod_n_max": 8}
TYPES = ["ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "ngram-cache,ngram-mod,ngram-map-k,ngram-simple"]


def speculation(lm, spec_type: str, **flags) -> Speculation:
    settings = resolve(ServerConfig(spec_type=spec_type, **{**SMALL, **flags}))
    return Speculation.load(settings, lm, measure_cost=False)


def served(lm, scheduler: Scheduler, *, slot: int = -1, sampler: SamplerParams | None = None, seed: int = 7):
    events: list = []
    opts = GenerationOptions(sampler=sampler or SamplerParams(temperature=0.0), seed=seed, n_predict=N_PREDICT,
                             return_tokens=True, cache_prompt=False, id_slot=slot)
    scheduler.submit(Task(prompt_tokens=lm.tokenizer.encode(PROMPT), options=opts, sink=events.append))
    for _ in range(400):
        if events and isinstance(events[-1], Final | Failed):
            break
        scheduler._iteration()
    assert isinstance(events[-1], Final), events[-1]
    return events[-1].result


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return served(tiny_llama, Scheduler(tiny_llama, n_slots=1, n_ctx=512, speculation=None)).tokens


@pytest.mark.parametrize("spec_type", TYPES)
def test_every_type_emits_the_plain_tokens_at_temperature_zero_and_drafts(tiny_llama, plain, spec_type):
    spec = speculation(tiny_llama, spec_type)
    scheduler = Scheduler(tiny_llama, n_slots=1, n_ctx=512, speculation=spec)
    for _ in range(2):  # the second request drafts with what the slot learned from the first
        result = served(tiny_llama, scheduler)
        assert result.tokens == plain
        draft = result.timings.draft
        assert draft.rounds > 0 and draft.proposed > 0 and draft.kind == spec.draft_kind


def test_a_sampled_request_emits_the_plain_tokens_under_the_same_seed(tiny_llama):
    sampler = SamplerParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0)
    alone = served(tiny_llama, Scheduler(tiny_llama, n_slots=1, n_ctx=512, speculation=None), sampler=sampler, seed=11)
    scheduler = Scheduler(tiny_llama, n_slots=1, n_ctx=512, speculation=speculation(tiny_llama, TYPES[-1]))
    drafted = 0
    for _ in range(2):
        result = served(tiny_llama, scheduler, sampler=sampler, seed=11)
        assert result.tokens == alone.tokens
        drafted += result.timings.draft.proposed if result.timings.draft else 0
    assert drafted > 0


@pytest.mark.parametrize("target", ["tiny_llama", "lfm2"])
def test_the_slot_ngram_cache_outlives_its_request_and_stays_with_its_slot(request, target):
    """On the ragged batch (the tiny llama) and on a row's own cache (LFM2's convolution state keeps its
    rows out of the ragged forward): the two places a speculating row starts its session."""
    lm = request.getfixturevalue("tiny_llama") if target == "tiny_llama" else request.getfixturevalue("hybrid")[target]
    scheduler = Scheduler(lm, n_slots=2, n_ctx=512, speculation=speculation(lm, "ngram-cache"))
    first = served(lm, scheduler, slot=0).timings.draft
    second = served(lm, scheduler, slot=0).timings.draft
    assert second.accepted > first.accepted and second.proposed > first.proposed
    other = served(lm, scheduler, slot=1).timings.draft  # a slot that never ran it
    assert (other.proposed, other.accepted) == (first.proposed, first.accepted)


@pytest.mark.parametrize("spec_type, flags, block", [
    ("ngram-map-k", {"spec_ngram_map_k_size_m": 2}, 2),
    ("ngram-mod", {"spec_ngram_mod_n_max": 3}, 3),
    ("ngram-cache", {}, 8),
    ("ngram-simple,ngram-cache", {"spec_ngram_simple_size_m": 5}, 8),
])
def test_each_type_drafts_within_its_own_size(tiny_llama, plain, spec_type, flags, block):
    spec = speculation(tiny_llama, spec_type, **flags)
    assert spec.settings.n_max == block
    scheduler = Scheduler(tiny_llama, n_slots=1, n_ctx=512, speculation=spec)
    for _ in range(2):
        result = served(tiny_llama, scheduler)
        draft = result.timings.draft
        assert result.tokens == plain and 0 < draft.proposed <= block * draft.rounds


def test_spec_draft_n_min_retracts_shorter_drafts(tiny_llama, plain):
    scheduler = Scheduler(tiny_llama, n_slots=1, n_ctx=512,
                          speculation=speculation(tiny_llama, "ngram-cache", spec_draft_n_min=8))
    for _ in range(2):
        result = served(tiny_llama, scheduler)
        draft = result.timings.draft
        assert result.tokens == plain and (draft is None or draft.proposed == 8 * draft.rounds)
    assert draft.rounds > 0  # the second time the slot's cache drafts whole blocks


def test_min_hits_holds_map_k4v_back(tiny_llama, plain):
    flags = {"spec_ngram_map_k4v_min_hits": 1000}
    scheduler = Scheduler(tiny_llama, n_slots=1, n_ctx=512, speculation=speculation(tiny_llama, "ngram-map-k4v", **flags))
    result = served(tiny_llama, scheduler)
    assert result.tokens == plain and (result.timings.draft is None or result.timings.draft.proposed == 0)


def test_settings_carry_each_type_parameters():
    s = resolve(ServerConfig(spec_type="ngram-map-k4v,ngram-mod", spec_ngram_map_k4v_size_n=5,
                             spec_ngram_map_k4v_size_m=7, spec_ngram_map_k4v_min_hits=2, spec_ngram_mod_n_match=16,
                             spec_ngram_mod_n_max=9, spec_ngram_mod_n_min=4))
    assert (s.lookup.map_k4v.size_n, s.lookup.map_k4v.size_m, s.lookup.map_k4v.min_hits) == (5, 7, 2)
    assert (s.lookup.mod.n_match, s.lookup.mod.n_max, s.lookup.mod.n_min) == (16, 9, 4)
    assert s.n_max == 9 and s.spec_type == "ngram-map-k4v,ngram-mod"
    defaults = resolve(ServerConfig(spec_type="ngram-map-k"))
    assert defaults.n_max == 48 and defaults.lookup.map_k.size_n == 12  # upstream's defaults
