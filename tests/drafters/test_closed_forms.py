"""The diagnostic line's claim, through the project's own round loop: the measured per-position
acceptance sits at the closed form of the rule that ran, ``sum_x p q`` under sampler-match and
``sum_x min(p, q)`` under the opt-in modified rejection sampling.

A draft model (the tiny llama target's own weights with a flatter head) drafts for the target at
temperature 1 with no filters, ``MLXCEL_SPECULATIVE_ACCEPT_DIAG``'s sums on. Each tested position
``i`` accepts with probability ``pi_i`` (its closed form, given everything before it), so
``accepted - sum pi_i`` is a sum of martingale differences with variance
``sum pi_i (1 - pi_i) <= n a (1 - a)`` (``a`` the mean closed form, by concavity). Tolerance:
4 of those standard deviations (about 6e-5 two-sided). Power: the pair is chosen so that the two
closed forms are far apart (sum p q ~ 0.24, sum min(p, q) ~ 0.77 measured), and each rule's
measurement must sit more than 8 standard deviations from the *other* rule's closed form.
"""

from __future__ import annotations

import math

import pytest
import tiny_checkpoints

from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import SAMPLER_MATCH, STOCHASTIC
from mlxcel.engine.speculative.session import SpeculativeSession

TOLERANCE_SIGMAS = 4.0
POWER_SIGMAS = 8.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("closed-forms")
    target = load_model(tiny_checkpoints.build_hf_checkpoint(root / "t", "llama", seed=1))
    drafter = load_model(tiny_checkpoints.build_hf_checkpoint(root / "d", "llama", seed=1, logit_scale=0.7))
    return target, drafter


def measure(pair, stochastic: bool, seeds: int, tokens: int) -> tuple[str, int, int, float, float]:
    """(rule, positions tested, accepted, sum of sum_x p q, sum of sum_x min(p, q)) over ``seeds`` runs."""
    target, draft = pair
    prompt = list(target.tokenizer.encode("The quick brown fox"))
    n = accepted = 0
    sum_prod = sum_min = 0.0
    rule = ""
    for seed in range(seeds):
        params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=50 + seed, ignore_eos=True)
        session = SpeculativeSession(DraftModelDrafter(draft), params, n_max=4, stochastic=stochastic,
                                     diagnostics=True)
        for _ in speculative_generate(target, session, prompt, max_tokens=tokens):
            pass
        c = session.counters
        assert c.diagnosed == c.positions_tested  # every tested position's closed forms are known
        rule = c.rule
        n, accepted = n + c.positions_tested, accepted + c.accepted
        sum_prod, sum_min = sum_prod + c.sum_prod, sum_min + c.sum_min
    return rule, n, accepted, sum_prod, sum_min


def z(accepted: int, expected: float, n: int) -> float:
    a = expected / n
    return (accepted - expected) / math.sqrt(n * a * (1 - a))


def check(pair, seeds: int, tokens: int) -> None:
    rule, n, accepted, sum_prod, sum_min = measure(pair, stochastic=False, seeds=seeds, tokens=tokens)
    assert rule == SAMPLER_MATCH
    assert abs(z(accepted, sum_prod, n)) <= TOLERANCE_SIGMAS, (accepted / n, sum_prod / n)
    assert abs(z(accepted, sum_min, n)) > POWER_SIGMAS  # and it is not at the other rule's closed form
    rule, n, accepted, sum_prod, sum_min = measure(pair, stochastic=True, seeds=seeds, tokens=tokens)
    assert rule == STOCHASTIC
    assert abs(z(accepted, sum_min, n)) <= TOLERANCE_SIGMAS, (accepted / n, sum_min / n)
    assert abs(z(accepted, sum_prod, n)) > POWER_SIGMAS
    assert sum_min >= sum_prod


def test_measured_acceptance_sits_at_the_closed_form_of_the_rule_that_ran(pair):
    check(pair, seeds=2, tokens=100)


@pytest.mark.slow
def test_measured_acceptance_sits_at_the_closed_form_long(pair):
    check(pair, seeds=6, tokens=300)
