"""On the DFlash path the opt-in modified rejection sampling is lossless; the default
argmax-against-argmax rule is not (above temperature 0).

The target here is a real tiny qwen3 model, so p changes with the context and a fixed-category
goodness of fit does not apply. Instead every emitted token ``x`` at position ``t`` is mapped
through the randomized probability integral transform of the target's exact conditional
distribution ``p_t`` (computed afterwards by one plain forward over the whole sequence; tokens
ordered by decreasing ``p_t``): ``u = P_t(before x) + V * p_t(x)`` with ``V ~ U[0, 1)``. If the
stream is a sample from the target, the ``u`` are i.i.d. uniform, whatever the context. The
guard is the same chi-square as tests/engine/speculative/test_distribution.py: six equal bins (dof 5),
rejected above 25.7448 (alpha = 1e-4), over ``MLXCEL_SPEC_DIST_SAMPLES`` tokens for the slow
instance and 2 000 in the default suite. Power check: the same statistic rejects the
argmax-against-argmax stream already at 500 tokens (about 4 800 at 1 000).

The same guard runs on a hybrid target (Qwen3.5: gated-delta linear-attention layers, whose state
each block round cuts back with its state tape): 800 tokens in the default suite,
``MLXCEL_SPEC_DIST_SAMPLES`` in the slow one, with the argmax-against-argmax power check there too.

What this guard cannot see: the tiny drafter overlaps the target only where both are diffuse
(near-uniform rows), and there a drafter that misreported q (say, uniform) moves the PIT
histogram too little to be rejected; the rule-level guards of test_distribution_speculative.py
(fixed p, very different q) are the ones with power against a wrong residual.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import tiny_drafters
from spec_fixtures import CHI2_CRITICAL, DIST_SAMPLES

from mlxcel.drafters.loading import load_model_drafter
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import switches
from mlxcel.engine.speculative.acceptance import ARGMAX_AGAINST_ARGMAX, STOCHASTIC
from mlxcel.engine.speculative.session import SpeculativeCounters, SpeculativeSession

BINS = 6
SEGMENT = 500  # tokens per generated sequence; several seeds make up the sample
FULL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-dflash")
    # diffuse p and q with partial overlap (measured sum_x min(p, q) ~ 0.6)
    target = load_model(tiny_drafters.build_target(root / "t", "qwen3", seed=3, logit_scale=0.08))
    return target, tiny_drafters.build_dflash(root / "d", target.path, layer_ids=(1, 3), logit_scale=0.04)


@pytest.fixture(scope="module")
def hybrid_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-dflash-hybrid")
    # measured: about 73% of tested drafts accepted under the stochastic rule
    target = load_model(tiny_drafters.build_target(root / "t", "qwen3_5", seed=3, logit_scale=0.08))
    return target, tiny_drafters.build_dflash(root / "d", target.path, layer_ids=(1, 3), logit_scale=0.8)


def pit_values(target, sequence: list[int], start: int, rng: np.random.Generator) -> list[float]:
    """Randomized PIT of tokens ``sequence[start:]`` under the target's exact conditionals."""
    logits = target.model(mx.array([sequence[:-1]]))[0].astype(mx.float32)
    p = np.asarray(mx.softmax(logits, axis=-1))
    out = []
    for t in range(start, len(sequence)):
        row = p[t - 1].astype(np.float64)
        order = np.argsort(-row, kind="stable")
        rank = int(np.nonzero(order == sequence[t])[0][0])
        before = row[order[:rank]].sum()
        out.append(float(before + rng.random() * row[sequence[t]]))
    return out


def stream_statistic(target, drafter_dir, n: int, *, stochastic: bool) -> tuple[float, SpeculativeCounters]:
    prompt = list(target.tokenizer.encode("The quick brown fox"))
    rng = np.random.default_rng(2024)
    values: list[float] = []
    total = SpeculativeCounters(rule="")
    seed = 100
    while len(values) < n:
        drafter = load_model_drafter(drafter_dir, target_vocab_size=target.vocab_size)
        session = SpeculativeSession(drafter, SamplerParams(seed=seed, **FULL), n_max=4, stochastic=stochastic)
        counters = session.counters
        emitted = [t for step in speculative_generate(target, session, prompt, max_tokens=min(SEGMENT, n - len(values)))
                   for t in step.tokens]
        values += pit_values(target, prompt + emitted, len(prompt), rng)
        total.rule = counters.rule
        total.rounds += counters.rounds
        total.accepted += counters.accepted
        total.positions_tested += counters.positions_tested
        seed += 1
    counts = np.bincount(np.minimum((np.asarray(values) * BINS).astype(int), BINS - 1), minlength=BINS)
    expected = len(values) / BINS
    return float(((counts - expected) ** 2 / expected).sum()), total


@pytest.fixture(autouse=True)
def block_path(monkeypatch):
    # the block path (one forward per round) is the one whose rows are shared between p and the rule
    monkeypatch.setenv(switches.PROBE_ENV, "pass")


def check_lossless(pair, n):
    target, drafter_dir = pair
    stat, counters = stream_statistic(target, drafter_dir, n, stochastic=True)
    assert counters.rule == STOCHASTIC
    # the rule really ran on both branches: many drafts accepted, many rejected
    assert 0.2 < counters.accepted / counters.positions_tested < 0.9
    assert stat <= CHI2_CRITICAL, f"stochastic on the DFlash path: chi-square {stat:.2f} > {CHI2_CRITICAL} ({n} tokens)"


def test_dflash_stochastic_stream_follows_the_target(pair):
    check_lossless(pair, 2000)


@pytest.mark.slow
def test_dflash_stochastic_stream_follows_the_target_full_sample(pair):
    check_lossless(pair, DIST_SAMPLES)


def test_chi_square_rejects_argmax_against_argmax_on_the_dflash_path(pair):
    target, drafter_dir = pair
    stat, counters = stream_statistic(target, drafter_dir, 500, stochastic=False)
    assert counters.rule == ARGMAX_AGAINST_ARGMAX
    assert stat > CHI2_CRITICAL, f"argmax-against-argmax not rejected: {stat:.2f}"


def test_stochastic_stream_follows_a_hybrid_target(hybrid_pair):
    check_lossless(hybrid_pair, 800)


@pytest.mark.slow
def test_stochastic_stream_follows_a_hybrid_target_full_sample(hybrid_pair):
    check_lossless(hybrid_pair, DIST_SAMPLES)
    target, drafter_dir = hybrid_pair
    stat, counters = stream_statistic(target, drafter_dir, 500, stochastic=False)
    assert counters.rule == ARGMAX_AGAINST_ARGMAX and stat > CHI2_CRITICAL
