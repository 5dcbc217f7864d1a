"""The shared verify forward's cost model (engine.speculative.verify_cost): the per-row draft cap it
gives at each batch width and acceptance, the environment's override, and the measurement at load
on a tiny real checkpoint."""

from __future__ import annotations

import math

import pytest

from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.speculative.verify_cost import VerifyCost, from_env, measure

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
