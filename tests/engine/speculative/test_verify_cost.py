"""The shared verify forward's cost model (engine.speculative.verify_cost): the per-row draft cap it
gives at each batch width and acceptance, the environment's override, and the measurement at load
on a tiny real checkpoint."""

from __future__ import annotations

import math

import pytest

from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.speculative.verify_cost import LearnedCost, VerifyCost, from_env, load, measure

SMOLLM2 = VerifyCost(25.0, 6.4)  # what a shared forward cost for SmolLM2 on the 2-core box


def test_one_row_keeps_n_max_whatever_its_acceptance():
    for accepted, tested in ((0, 0), (0, 50), (3, 40), (40, 40)):
        assert SMOLLM2.draft_cap(1, accepted, tested, n_max=32, n_min=0) == 32


def test_a_wide_batch_with_low_acceptance_drafts_fewer_but_never_below_n_min():
    good, fair, poor = (90, 100), (80, 100), (20, 100)  # accepted of tested drafted positions
    caps = {rows: SMOLLM2.draft_cap(rows, *fair, n_max=16) for rows in (1, 2, 4, 8)}
    assert caps == {1: 16, 2: 4, 4: 3, 8: 1}  # a = 0.80 against bars of 0.20, 0.34, 0.51, 0.67
    # a row accepting ~1 in 5 keeps only its one probe draft as soon as it shares the forward
    assert all(SMOLLM2.draft_cap(rows, *poor, n_max=16) == 1 for rows in (2, 4, 8))
    assert SMOLLM2.draft_cap(8, *good, n_max=16) == 3  # a row that is accepted more keeps more
    for n_min in (2, 3, 5):
        assert SMOLLM2.draft_cap(8, *poor, n_max=16, n_min=n_min) == n_min
    assert SMOLLM2.draft_cap(8, *poor, n_max=0) == 0
    # a fresh row (no evidence) starts at the prior's 0.8: not capped to nothing before it has drafted
    assert SMOLLM2.draft_cap(4, 0, 0, n_max=32) == 3


def test_a_row_no_draft_of_which_pays_drafts_only_to_probe_or_on_its_peeks():
    poor, good = (20, 100), (90, 100)
    for rows in (2, 4, 8):
        assert SMOLLM2.draft_cap(rows, *poor, n_max=16, probe=False) == 0
        assert SMOLLM2.draft_cap(rows, *poor, n_max=16, n_min=3, probe=False) == 0  # the floor is no reason to draft
        assert SMOLLM2.draft_cap(rows, *poor, n_max=16, probe=True) == 1
        # a row that peeks gathers its evidence for free: no probe, and nothing before its first evidence
        assert SMOLLM2.draft_cap(rows, *poor, n_max=16, probe=True, peeks=True) == 0
        assert SMOLLM2.draft_cap(rows, 0, 0, n_max=16, peeks=True) == 0
        assert SMOLLM2.draft_cap(rows, 0, 0, n_max=16) >= 1  # the prior's 0.8 without peeks
        # a row whose drafts pay is capped as before, whether it peeks or probes
        paid = SMOLLM2.draft_cap(rows, *good, n_max=16)
        assert paid >= 1 and paid == SMOLLM2.draft_cap(rows, *good, n_max=16, probe=False, peeks=True)
    # one row keeps n_max whatever it shows
    assert SMOLLM2.draft_cap(1, 0, 0, n_max=16, probe=False, peeks=True) == 16
    assert SMOLLM2.draft_cap(1, *poor, n_max=16, probe=False, peeks=True) == 16


def test_the_cap_is_where_the_next_draft_stops_paying():
    rows, accepted, tested = 4, 60, 80
    a = (accepted + 4) / (tested + 5)
    bar = 6.4 / (6.4 + 25.0 / rows)
    k = SMOLLM2.draft_cap(rows, accepted, tested, n_max=64)
    assert a ** k > bar >= a ** (k + 1)
    # where the fixed cost dominates (a GPU), drafts stay nearly free at any width
    assert VerifyCost(25.0, 0.05).draft_cap(8, accepted, tested, n_max=8) == 8


def test_the_environment_gives_or_turns_off_the_model():
    assert from_env({}) is None
    assert from_env({"MLXCEL_VERIFY_COST": "off"}) == "off"
    cost = from_env({"MLXCEL_VERIFY_COST": "25, 6.4"})
    assert (cost.fixed_ms, cost.per_token_ms, cost.source) == (25.0, 6.4, "given")
    for bad in ("25", "a,b", "-1,2", "inf,1"):
        with pytest.raises(MlxcelError, match="MLXCEL_VERIFY_COST"):
            from_env({"MLXCEL_VERIFY_COST": bad})


def test_measured_at_load_on_a_real_checkpoint(tiny_llama):
    cost = measure(tiny_llama.model, tiny_llama.make_cache, tiny_llama.vocab_size)
    assert cost is not None and cost.source == "measured"
    assert math.isfinite(cost.fixed_ms) and math.isfinite(cost.per_token_ms)
    assert cost.fixed_ms >= 0 and cost.per_token_ms >= 0 and cost.fixed_ms + cost.per_token_ms > 0


@pytest.mark.parametrize("burst", [3, 5])
def test_a_stall_over_consecutive_forwards_at_load_does_not_move_the_line(tiny_llama, burst):
    """The forwards really run (a tiny checkpoint); their times are scripted: 10 ms + 1.5 ms a token,
    and a stall of 60 ms over ``burst`` consecutive forwards, starting anywhere. Each width keeps its
    best over rounds in which the widths take turns, so the stall never reaches every round of a
    width and the line comes out exact. (Measured back to back, a width's repeats all fell in such
    a stall: its point rose by the stall and the fit's fixed part with it.)"""
    for start in range(0, 12):
        calls: list[int] = []

        def timed(n_tokens, run):
            assert run() > 0
            calls.append(n_tokens)
            return 10.0 + 1.5 * n_tokens + (60.0 if start <= len(calls) - 1 < start + burst else 0.0)

        cost = measure(tiny_llama.model, tiny_llama.make_cache, tiny_llama.vocab_size, timed=timed)
        assert len(calls) >= 9 and sorted(set(calls)) == [2, 16, 32]
        assert cost.fixed_ms == pytest.approx(10.0) and cost.per_token_ms == pytest.approx(1.5), (start, calls)


# -- learned while serving (LearnedCost) -----------------------------------------------------------------

def _feed(cost: LearnedCost, fixed: float, per_token: float, widths=(4, 12, 20, 36), rounds: int = 40) -> None:
    for _ in range(rounds):
        for n in widths:
            cost.observe_step(n, fixed + per_token * n)


def test_the_learned_line_converges_from_a_wrong_start_to_the_steps_it_sees():
    cost = LearnedCost(VerifyCost(13.7, 1.29, source="measured"))  # a noisy start-up measurement
    assert (cost.fixed_ms, cost.per_token_ms) == (13.7, 1.29)
    _feed(cost, 8.0, 1.4)
    assert cost.fixed_ms == pytest.approx(8.0, rel=0.05)
    assert cost.per_token_ms == pytest.approx(1.4, rel=0.05)
    assert cost.steps == 160 and cost.source == "learned"
    # the other way round: from a start below the truth
    low = LearnedCost(VerifyCost(5.4, 0.89, source="measured"))
    _feed(low, 8.0, 1.4)
    assert low.fixed_ms == pytest.approx(8.0, rel=0.05) and low.per_token_ms == pytest.approx(1.4, rel=0.05)


def test_the_fit_follows_a_change_of_cost_and_keeps_its_slope_when_every_step_has_one_width():
    cost = LearnedCost(VerifyCost(8.0, 1.4, source="measured"))
    _feed(cost, 8.0, 1.4)
    _feed(cost, 12.0, 2.0)  # the context grew, the load rose
    assert cost.fixed_ms == pytest.approx(12.0, rel=0.05) and cost.per_token_ms == pytest.approx(2.0, rel=0.05)
    one = LearnedCost(VerifyCost(8.0, 1.4, source="measured"))
    for _ in range(200):
        one.observe_step(16, 40.0)  # every step 16 tokens: the line passes through it, the prior keeps a slope
    assert one.step_ms(16) == pytest.approx(40.0, rel=0.03)
    assert one.per_token_ms > 0.5 and one.fixed_ms > 0


def test_one_stalled_step_does_not_swing_the_fit():
    cost = LearnedCost(VerifyCost(8.0, 1.4, source="measured"))
    _feed(cost, 8.0, 1.4)
    before = [cost.step_ms(n) for n in (2, 16, 36)] + [cost.bar(4), cost.bar(8)]
    cost.observe_step(16, 20 * (8.0 + 1.4 * 16))  # a twenty-fold stall (another process, a collection)
    after = [cost.step_ms(n) for n in (2, 16, 36)] + [cost.bar(4), cost.bar(8)]
    assert after == pytest.approx(before, rel=0.05), (before, after)
    assert after[1] > before[1]  # it does count, a little
    unclipped = LearnedCost(VerifyCost(8.0, 1.4, source="measured"))  # what the stall would do unclipped
    _feed(unclipped, 8.0, 1.4)
    unclipped.observe_step(16, 1.25 * unclipped.step_ms(16))  # at the clip
    assert unclipped.step_ms(16) == pytest.approx(after[1])
    for bad in (0.0, -5.0, math.inf, math.nan):  # not a timing: ignored
        cost.observe_step(16, bad)
    cost.observe_step(0, 10.0)
    assert cost.steps == 161
    # the same for the pipelined ratio
    _feed_pipelined(cost, 4, 0.5)
    ratio = cost.pipelined_ratio
    cost.observe_pipelined(4, 30 * cost.step_ms(4))
    assert cost.pipelined_ratio == pytest.approx(ratio, rel=0.08)


def _feed_pipelined(cost: LearnedCost, rows: int, ratio: float, n: int = 100) -> None:
    for _ in range(n):
        cost.observe_pipelined(rows, ratio * cost.step_ms(rows))


def test_the_bar_against_the_pipelined_step():
    cost = LearnedCost(VerifyCost(8.0, 1.4, source="measured"))
    # before any pipelined step is seen, the pipelined step is priced as the unpipelined one
    assert cost.pipelined_ratio == 1.0
    assert cost.bar(4, pipelined=True) == pytest.approx(cost.bar(4)) == pytest.approx(1.4 / (1.4 + 8.0 / 4))
    assert cost.bar(4) == pytest.approx(VerifyCost(8.0, 1.4).bar(4))  # unpipelined: the fixed model's bar
    # four rows pipelined at 10 ms a step (2.5 ms a token) against 13.6 ms waited for
    for _ in range(100):
        cost.observe_pipelined(4, 10.0)
    assert cost.pipelined_ratio == pytest.approx(10.0 / 13.6, rel=0.02)
    assert cost.plain_ms_per_token(4, pipelined=True) == pytest.approx(2.5, rel=0.02)
    assert cost.bar(4, pipelined=True) == pytest.approx(1.4 / 2.5, rel=0.02)
    assert cost.bar(4, pipelined=True) > cost.bar(4)
    # so a row at the prior's 0.8 drafts fewer positions where the rows would ride the pipeline
    waited, riding = cost.draft_cap(4, 0, 0, n_max=32), cost.draft_cap(4, 0, 0, n_max=32, pipelined=True)
    assert (waited, riding) == (3, 2)  # 0.8 ** k against bars of 0.41 and 0.56
    a = 0.8
    assert a ** riding > cost.bar(4, pipelined=True) >= a ** (riding + 1)
    # a bar above 1 (drafts never pay) keeps one probe draft, and n_min; one row keeps n_max
    for _ in range(200):
        cost.observe_pipelined(8, 0.2 * cost.step_ms(8))
    assert cost.bar(8, pipelined=True) > 1
    assert cost.draft_cap(8, 90, 100, n_max=16, pipelined=True) == 1
    assert cost.draft_cap(8, 90, 100, n_max=16, n_min=3, pipelined=True) == 3
    assert cost.draft_cap(1, 0, 100, n_max=16, pipelined=True) == 16


def test_a_pinned_model_never_learns_and_ignores_the_pipeline():
    pinned = VerifyCost(25.0, 6.4)
    assert not pinned.learns and LearnedCost(pinned).learns
    assert pinned.bar(4, pipelined=True) == pinned.bar(4)
    for rows in (2, 4, 8):
        assert pinned.draft_cap(rows, 80, 100, n_max=16, pipelined=True) == pinned.draft_cap(rows, 80, 100, n_max=16)
    assert from_env({"MLXCEL_VERIFY_COST": "measured"}) == "measured"
    assert from_env({"MLXCEL_VERIFY_COST": "learn"}) == "learn"


def test_load_measures_and_learns_only_when_asked(tiny_llama, monkeypatch):
    args = (tiny_llama.model, tiny_llama.make_cache, tiny_llama.vocab_size)
    monkeypatch.delenv("MLXCEL_VERIFY_COST", raising=False)
    default = load(*args)
    assert isinstance(default, VerifyCost) and default.source == "measured"  # unset: measured, never learned
    monkeypatch.setenv("MLXCEL_VERIFY_COST", "learn")
    learned = load(*args)
    assert isinstance(learned, LearnedCost) and learned.start.source == "measured"
    assert "learned from 0 steps" in learned.describe()
    assert load(*args, may_measure=False) is None  # lockstep ranks: no cap
    monkeypatch.setenv("MLXCEL_VERIFY_COST", "measured")
    measured = load(*args)
    assert isinstance(measured, VerifyCost) and measured.source == "measured"
    monkeypatch.setenv("MLXCEL_VERIFY_COST", "25,6.4")
    assert load(*args) == VerifyCost(25.0, 6.4, source="given")
    monkeypatch.setenv("MLXCEL_VERIFY_COST", "off")
    assert load(*args) is None
