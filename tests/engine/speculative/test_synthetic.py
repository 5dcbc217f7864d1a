"""Synthetic acceptance (llama-server's ``--spec-synth-*``, benchmarking only): drafts are accepted at
the set per-position rates whatever the target says. At rate 0 the stream is the target's own; at
rate 1 every draft is accepted (never an end-of-generation draft); in between the measured
per-position acceptance follows the rate, and the report names the rule for what it is."""

from __future__ import annotations

import numpy as np
import pytest
from target_only import speculative_tokens, target_only_tokens

from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import SYNTHETIC, synthetic_accept
from mlxcel.engine.speculative.report import acceptance_line

GREEDY = SamplerParams(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompt(tiny_llama):
    return list(tiny_llama.tokenizer.encode("The quick brown fox jumps over the lazy dog"))


def test_rate_zero_is_the_target_stream_and_rate_one_accepts_every_draft(tiny_llama, tiny_qwen, prompt):
    plain = target_only_tokens(tiny_llama, prompt, GREEDY, 24)
    drafter = DraftModelDrafter(tiny_qwen, target_vocab_size=tiny_llama.vocab_size)
    out, counters = speculative_tokens(tiny_llama, drafter, prompt, GREEDY, 24, k=3, synth_probs=(0.0, 0.0, 0.0))
    assert out == plain and counters.rule == SYNTHETIC and counters.accepted == 0 and counters.rounds > 0
    drafter = DraftModelDrafter(tiny_qwen, target_vocab_size=tiny_llama.vocab_size)
    out, counters = speculative_tokens(tiny_llama, drafter, prompt, GREEDY, 24, k=3, synth_probs=(1.0, 1.0, 1.0))
    assert counters.accepted == counters.proposed > 0  # whatever the target says
    assert "benchmarking only" in acceptance_line(counters)


def test_the_measured_acceptance_follows_the_rate():
    """Per position, the share of chains that get past it is the product of the rates so far."""
    probs = (0.8, 0.5, 0.25)
    reached = np.zeros(3)
    n = 3000
    for seed in range(n):
        outcome = synthetic_accept([1, 1, 1, 1], [2, 2, 2], probs, seed=seed, first_position=10)
        reached[:outcome.accepted] += 1
    expected = np.cumprod(probs)
    assert np.all(np.abs(reached / n - expected) < 4 * np.sqrt(expected * (1 - expected) / n))


def test_an_end_of_generation_draft_is_never_accepted():
    outcome = synthetic_accept([5, 6, 7], [9, 2], (1.0, 1.0), seed=1, first_position=0, eos=frozenset({2}))
    assert outcome.accepted == 1 and outcome.emitted == [9, 6]
