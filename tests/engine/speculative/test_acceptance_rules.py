"""The acceptance rules one position at a time, the rule selector and its environment switch.

Statistical checks use a stated tolerance: a binomial proportion must lie within 4.5 standard
errors of its exact value (two-sided alpha ~ 7e-6), and distributions are checked by
chi-square at alpha = 1e-4. Where a rule is deterministic, the check is exact.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from spec_fixtures import CHI2_CRITICAL, chi_square

from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import acceptance as acc
from mlxcel.engine.speculative import switches

P = np.array([0.40, 0.25, 0.15, 0.10, 0.10, 0.00])
Q = np.array([0.10, 0.10, 0.20, 0.20, 0.25, 0.15])
SAMPLING = SamplerParams(temperature=0.7)


def within_binomial(hits: int, n: int, prob: float, z: float = 4.5) -> bool:
    se = math.sqrt(max(prob * (1 - prob), 1e-12) / n)
    return abs(hits / n - prob) <= z * se + 1e-12


# -- the environment switch and the selector ----------------------------------------------------

@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " On "])
def test_stochastic_env_on_values(value):
    assert switches.stochastic_accept_enabled(environ={switches.STOCHASTIC_ACCEPT_ENV: value}) is True


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "OFF", ""])
def test_stochastic_env_off_values(value):
    assert switches.stochastic_accept_enabled(environ={switches.STOCHASTIC_ACCEPT_ENV: value}) is False


def test_stochastic_env_unset_is_off():
    assert switches.stochastic_accept_enabled(environ={}) is False


def test_stochastic_env_garbage_is_a_clear_error():
    with pytest.raises(MlxcelError, match=switches.STOCHASTIC_ACCEPT_ENV):
        switches.stochastic_accept_enabled(environ={switches.STOCHASTIC_ACCEPT_ENV: "maybe"})


def test_programmatic_override_beats_the_environment():
    on, off = {switches.STOCHASTIC_ACCEPT_ENV: "1"}, {switches.STOCHASTIC_ACCEPT_ENV: "0"}
    assert switches.stochastic_accept_enabled(False, on) is False
    assert switches.stochastic_accept_enabled(True, off) is True
    assert acc.select_rule(SAMPLING, has_proposal_distribution=True, stochastic=False, environ=on) == acc.SAMPLER_MATCH
    assert acc.select_rule(SAMPLING, has_proposal_distribution=True, stochastic=True, environ=off) == acc.STOCHASTIC


def test_selector_default_and_opt_in():
    assert acc.select_rule(SAMPLING, has_proposal_distribution=True, environ={}) == acc.SAMPLER_MATCH
    on = {switches.STOCHASTIC_ACCEPT_ENV: "yes"}
    assert acc.select_rule(SAMPLING, has_proposal_distribution=True, environ=on) == acc.STOCHASTIC
    assert acc.select_rule(SAMPLING, has_proposal_distribution=False, environ=on) == acc.SAMPLER_MATCH_NO_Q
    # q one-hot: sampler-match is already optimal, the opt-in changes nothing.
    assert acc.select_rule(SAMPLING, has_proposal_distribution=False, deterministic_proposals=True,
                           environ=on) == acc.SAMPLER_MATCH
    assert acc.select_rule(SAMPLING, has_proposal_distribution=False, argmax_verify=True,
                           environ=on) == acc.ARGMAX_AGAINST_ARGMAX


@pytest.mark.parametrize("params", [SamplerParams(temperature=0.0), SamplerParams(temperature=1.3, top_k=1)])
def test_greedy_is_chosen_before_anything_else_is_consulted(params):
    # An unparseable environment would raise if it were read: greedy returns before that.
    bad = {switches.STOCHASTIC_ACCEPT_ENV: "maybe"}
    for kwargs in ({}, {"argmax_verify": True}, {"deterministic_proposals": True}):
        assert acc.select_rule(params, has_proposal_distribution=True, environ=bad, **kwargs) == acc.GREEDY_ARGMAX
    assert acc.select_rule(params, has_proposal_distribution=True, stochastic=True) == acc.GREEDY_ARGMAX


def test_rule_ids_are_the_stable_set():
    assert set(acc.RULES) == {"stochastic", "greedy-argmax", "sampler-match",
                              "sampler-match-no-proposal-distribution", "argmax-against-argmax",
                              "synthetic"}  # --spec-synth-*: benchmarking only, never exact
    assert set(acc.RULE_DESCRIPTIONS) == set(acc.RULES)


# -- the chain walk (greedy, sampler-match, argmax-against-argmax) ------------------------------

def test_walk_chain_all_accepted_emits_the_bonus():
    out = acc.walk_chain([5, 6, 7, 8], [5, 6, 7])
    assert (out.accepted, out.emitted, out.tested, out.fully_accepted) == (3, [5, 6, 7, 8], 3, True)


def test_walk_chain_stops_at_the_first_rejection_and_emits_the_target_choice():
    out = acc.walk_chain([5, 9, 7, 8], [5, 6, 7])
    assert (out.accepted, out.emitted, out.tested, out.fully_accepted) == (1, [5, 9], 2, False)
    out = acc.walk_chain([4, 6, 7, 8], [5, 6, 7])
    assert (out.accepted, out.emitted, out.tested) == (0, [4], 1)


def test_walk_chain_without_drafts_is_a_plain_step():
    out = acc.walk_chain([3], [])
    assert (out.accepted, out.emitted, out.tested) == (0, [3], 0)


# -- modified rejection sampling -----------------------------------------------------------------

def rows(*vectors) -> mx.array:
    return mx.array(np.stack(vectors).astype(np.float32))


def accept_count(draft: int, n: int, seed: int = 3) -> int:
    p, q = rows(P, P), rows(Q)
    return sum(acc.rejection_sample(p, q, [draft], seed=seed, first_position=i).accepted for i in range(n))


@pytest.mark.parametrize("draft", [2, 3, 4])
def test_accept_rate_is_min_one_p_over_q(draft):
    n = 2500
    prob = min(1.0, P[draft] / Q[draft])
    hits = accept_count(draft, n)
    assert within_binomial(hits, n, prob), (draft, hits / n, prob)


def test_a_draft_with_p_at_least_q_is_always_accepted_and_p_zero_never():
    assert accept_count(0, 300) == 300  # p = 0.40 >= q = 0.10
    assert accept_count(5, 300) == 0  # p = 0: never, whatever u is


def test_residual_is_normalized_relu_of_p_minus_q():
    got = np.array(acc.residual_distribution(mx.array(P.astype(np.float32)), mx.array(Q.astype(np.float32))))
    want = np.maximum(P - Q, 0)
    np.testing.assert_allclose(got, want / want.sum(), atol=1e-6)
    # No residual mass (p == q): falls back to p rather than dividing by zero.
    same = np.array(acc.residual_distribution(mx.array(P.astype(np.float32)), mx.array(P.astype(np.float32))))
    np.testing.assert_allclose(same, P, atol=1e-7)


def test_rejected_positions_emit_from_the_residual():
    # Draft 5 has p = 0, so it is always rejected and every emitted token is a residual draw.
    p, q = rows(P, P), rows(Q)
    tokens = [acc.rejection_sample(p, q, [5], seed=11, first_position=i).emitted[-1] for i in range(3000)]
    counts = np.bincount(tokens, minlength=6).astype(float)
    residual = np.maximum(P - Q, 0)
    residual /= residual.sum()
    support = residual > 0
    assert counts[~support].sum() == 0
    assert chi_square(counts[support], residual[support]) <= CHI2_CRITICAL  # dof 1 here: conservative


def test_acceptance_with_drafts_from_q_reaches_sum_min_the_coupling_ceiling():
    rng = np.random.default_rng(5)
    n = 3000
    drafts = rng.choice(6, size=n, p=Q)
    p, q = rows(P, P), rows(Q)
    hits = sum(acc.rejection_sample(p, q, [int(d)], seed=2, first_position=i).accepted for i, d in enumerate(drafts))
    ceiling = float(np.minimum(P, Q).sum())
    assert within_binomial(hits, n, ceiling), (hits / n, ceiling)
    # Sampler-match with the same drafts accepts at sum p q, strictly below the ceiling here.
    target = rng.choice(6, size=n, p=P)
    sm_hits = int((target == drafts).sum())
    assert within_binomial(sm_hits, n, float((P * Q).sum()))
    assert (P * Q).sum() < ceiling


def test_closed_forms_match_numpy_and_sum_min_dominates_sum_prod():
    rng = np.random.default_rng(0)
    ps = rng.dirichlet(np.ones(50) * 0.3, size=64)
    qs = rng.dirichlet(np.ones(50) * 0.3, size=64)
    smin, sprod = acc.closed_forms(mx.array(ps.astype(np.float32)), mx.array(qs.astype(np.float32)))
    np.testing.assert_allclose(np.array(smin), np.minimum(ps, qs).sum(-1), atol=1e-5)
    np.testing.assert_allclose(np.array(sprod), (ps * qs).sum(-1), atol=1e-5)
    assert np.all(np.array(smin) >= np.array(sprod) - 1e-6)


def test_rejection_sample_bonus_after_a_clean_sweep():
    p = rows(P, P, P)
    q = rows(P, P)  # q == p: every draft is accepted
    out = acc.rejection_sample(p, q, [0, 1], seed=1, first_position=10)
    assert out.accepted == 2 and out.tested == 2 and out.emitted[:2] == [0, 1] and len(out.emitted) == 3
    assert P[out.emitted[2]] > 0
