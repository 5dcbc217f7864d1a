"""Draws follow p: chi-square goodness of fit (alpha = 1e-4) with a power check that the same
statistic rejects a wrong distribution, and the XTC coin's firing rate."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
from scipy import stats

from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams

ALPHA = 1e-4
T = 6000  # positions, one draw each


def chi_square_p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside p's support was drawn"
    stat = float((((counts - expected) ** 2)[support] / expected[support]).sum())
    return float(stats.chi2.sf(stat, int(support.sum()) - 1))


def draw_block(params: SamplerParams, logits_row: np.ndarray, seed: int):
    chain = SamplerChain(params, vocab_size=len(logits_row))
    x = mx.array(np.tile(logits_row, (T, 1)))
    tokens = chain.select(x, [], [0] * (T - 1), seed=seed, first_position=1000)
    p = np.array(chain.distribution(x, [], [0] * (T - 1), seed=seed, first_position=1000))
    return np.bincount(tokens, minlength=len(logits_row)), p


LOGITS = np.array([2.0, 1.6, 1.1, 0.7, 0.2, -0.3, -1.0, -2.5], dtype=np.float32)


def test_draws_follow_the_effective_distribution():
    params = SamplerParams(temperature=0.6, top_k=6, top_p=0.97, min_p=0.02)
    counts, p = draw_block(params, LOGITS, seed=2024)
    assert chi_square_p_value(counts, p.sum(0)) > ALPHA
    # power: the same draws against p without the temperature (T = 1) are rejected
    wrong = np.array(SamplerChain(replace(params, temperature=1.0), vocab_size=8).distribution(mx.array(LOGITS[None]), []))
    assert chi_square_p_value(counts, wrong[0] * T) < ALPHA


def test_xtc_mixture_and_coin_rate():
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=0.3, xtc_threshold=0.1)
    counts, p = draw_block(params, LOGITS, seed=7)
    fired = p[:, 0] == 0  # the top token is removed exactly when XTC fires here
    assert stats.binomtest(int(fired.sum()), T, 0.3).pvalue > ALPHA
    assert chi_square_p_value(counts, p.sum(0)) > ALPHA
    never = np.array(SamplerChain(replace(params, xtc_probability=0.0), vocab_size=8).distribution(mx.array(LOGITS[None]), []))
    assert chi_square_p_value(counts, never[0] * T) < ALPHA
