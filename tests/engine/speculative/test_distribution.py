"""The emitted stream of a speculative run follows the target's distribution exactly.

Chi-square goodness of fit, six outcomes (dof 5), rejected above 25.7448 (alpha = 1e-4), over
MLXCEL_SPEC_DIST_SAMPLES emitted tokens (12 000 by default). The target is a fixed categorical
at every position (``spec_fixtures.FixedLogitsModel``), the drafter proposes from a very
different q, and the real ``verify_round`` / sampler chain / rules run in between. The power
checks show the same statistic, at the same sample count, rejects two wrong rules.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from spec_fixtures import (
    CHI2_CRITICAL,
    DIST_SAMPLES,
    PROPOSAL_Q,
    TARGET_LOGITS,
    FixedLogitsModel,
    FixedProposalDrafter,
    PositionCache,
    chi_square,
    target_p,
)

from mlxcel.engine.sampling.chain import SamplerChain, sample
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.speculative.acceptance import (
    ARGMAX_AGAINST_ARGMAX,
    SAMPLER_MATCH,
    STOCHASTIC,
    ChainOutcome,
)
from mlxcel.engine.speculative.verify import verify_round

FULL = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def run_stream(rule: str, n: int, params: SamplerParams = FULL, *, k: int = 4, seed: int = 1234) -> list[int]:
    """Emit ``n`` tokens through real verify rounds; checks the cache arithmetic on the way."""
    model = FixedLogitsModel(TARGET_LOGITS)
    cache = [PositionCache()]
    chain = SamplerChain(params, vocab_size=len(TARGET_LOGITS))
    drafter = FixedProposalDrafter(PROPOSAL_Q, seed=seed)
    sequence = [0]
    out: list[int] = []
    while len(out) < n:
        r = verify_round(model, cache, chain, drafter, sequence, rule=rule, k=k, seed=seed)
        sequence.extend(r.emitted)
        out.extend(r.emitted)
        assert cache[0].offset == len(sequence) - 1
    return out[:n]


def counts_of(tokens: list[int]) -> np.ndarray:
    return np.bincount(np.asarray(tokens), minlength=len(TARGET_LOGITS)).astype(np.float64)


@pytest.mark.parametrize("rule", [SAMPLER_MATCH, STOCHASTIC])
def test_speculative_stream_matches_the_target_distribution(rule):
    stat = chi_square(counts_of(run_stream(rule, DIST_SAMPLES)), target_p())
    assert stat <= CHI2_CRITICAL, f"{rule}: chi-square {stat:.2f} > {CHI2_CRITICAL} over {DIST_SAMPLES} tokens"


def resample_from_p_instead_of_residual(p: mx.array, q: mx.array, drafts, *, seed, first_position) -> ChainOutcome:
    """A wrong rule: rejection sampling whose rejected positions draw from p, not the residual."""
    k = len(drafts)
    for i, d in enumerate(drafts):
        u = mx.random.uniform(key=position_key(seed, first_position + i, 1)).item()
        if not u * q[i, d].item() <= p[i, d].item():
            return ChainOutcome(i, list(drafts[:i]) + [sample(p[i], position_key(seed, first_position + i, 2))], i + 1)
    return ChainOutcome(k, list(drafts) + [sample(p[k], position_key(seed, first_position + k))], k)


def run_rule_stream(rule_fn, n: int, *, k: int = 4, seed: int = 99) -> list[int]:
    """The same stream at the level of one rule function, for rules we do not ship."""
    p = mx.broadcast_to(mx.array(target_p().astype(np.float32)), (k + 1, len(TARGET_LOGITS)))
    drafter = FixedProposalDrafter(PROPOSAL_Q, seed=seed)
    out: list[int] = []
    while len(out) < n:
        prop = drafter.propose([], k)
        out.extend(rule_fn(p, prop.q, prop.tokens, seed=seed, first_position=len(out)).emitted)
    return out[:n]


def test_chi_square_rejects_known_wrong_acceptance_rules():
    wrong_residual = chi_square(counts_of(run_rule_stream(resample_from_p_instead_of_residual, DIST_SAMPLES)),
                                target_p())
    assert wrong_residual > CHI2_CRITICAL, f"resample-from-p not rejected: {wrong_residual:.2f}"
    argmax = chi_square(counts_of(run_stream(ARGMAX_AGAINST_ARGMAX, DIST_SAMPLES)), target_p())
    assert argmax > CHI2_CRITICAL, f"argmax-against-argmax not rejected: {argmax:.2f}"


@pytest.mark.parametrize("rule", [SAMPLER_MATCH, STOCHASTIC])
def test_filtered_target_support_is_never_violated(rule):
    # top_k = 2 keeps tokens 0 and 1; the drafter puts 85% of its mass elsewhere.
    params = SamplerParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    tokens = run_stream(rule, 3000, params, seed=7)
    outside = [t for t in tokens if t not in (0, 1)]
    assert outside == []
