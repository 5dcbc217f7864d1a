"""The sampler chain against the NumPy reference, and its block / greedy / seed properties."""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from sampler_reference import reference_block

from mlxcel.engine.sampling.chain import SamplerChain, sample
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.sampling.xtc import xtc_coins

V = 96
EOS = (3, 7)

BASE = SamplerParams(seed=0)
COMBOS = {
    "defaults": BASE,
    "no_filters": replace(BASE, top_k=0, top_p=1.0, min_p=0.0, temperature=1.3),
    "top_k_only": replace(BASE, top_k=5, top_p=1.0, min_p=0.0),
    "top_k_over_vocab": replace(BASE, top_k=V + 50, top_p=0.9, min_p=0.0),
    "top_p_only": replace(BASE, top_k=0, top_p=0.7, min_p=0.0),
    "min_p_only": replace(BASE, top_k=0, top_p=1.0, min_p=0.2),
    "min_p_above_one": replace(BASE, top_k=0, top_p=1.0, min_p=1.5),
    "typical_only": replace(BASE, top_k=0, top_p=1.0, min_p=0.0, typical_p=0.6),
    "typical_then_minp": replace(BASE, top_k=30, top_p=1.0, min_p=0.1, typical_p=0.5),
    "all_filters": replace(BASE, top_k=20, top_p=0.9, min_p=0.05, typical_p=0.8, temperature=0.7),
    "min_keep_3": replace(BASE, top_k=0, top_p=0.2, min_p=0.5, typical_p=0.3, min_keep=3),
    "xtc_always": replace(BASE, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.02),
    "xtc_coin": replace(BASE, top_k=40, xtc_probability=0.5, xtc_threshold=0.05, min_keep=2),
    "penalties": replace(BASE, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3, repeat_last_n=8),
    "penalties_whole": replace(BASE, repeat_penalty=0.8, frequency_penalty=-0.2, repeat_last_n=-1, top_k=0),
    "bias_ignore_eos": replace(BASE, logit_bias={0: 2.5, 5: -1.0, 9: float("-inf")}, ignore_eos=True),
    "dry": replace(BASE, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1),
    "everything": replace(BASE, top_k=25, top_p=0.92, min_p=0.03, typical_p=0.9, xtc_probability=0.5,
                          xtc_threshold=0.1, repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5,
                          dry_multiplier=0.8, dry_penalty_last_n=16, logit_bias={4: 1.0}, temperature=0.9),
}


def random_case(seed: int, rows: int = 5, ties: bool = False):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, V)).astype(np.float32) * 2.5
    if ties:
        logits = np.round(logits).astype(np.float32)  # a handful of distinct values: ties everywhere
    history = rng.integers(0, 12, size=int(rng.integers(0, 40))).tolist()  # small alphabet: repeats
    appended = rng.integers(0, 12, size=rows - 1).tolist()
    return logits, history, appended


def engine_block(chain, logits, history, appended, seed, first):
    x = mx.array(logits)
    adjusted = np.array(chain.adjusted_logits(x, history, appended))
    dist = np.array(chain.distribution(x, history, appended, seed=seed, first_position=first))
    return adjusted, dist


def check_against_reference(params, logits, history, appended, seed=11, first=40):
    chain = SamplerChain(params, vocab_size=V, eos_token_ids=EOS)
    adjusted, dist = engine_block(chain, logits, history, appended, seed, first)
    coins = np.array(xtc_coins(seed, first, logits.shape[0]))
    ref_adjusted, ref_dist = reference_block(logits, history, appended, params, eos_ids=EOS, coins=coins)
    np.testing.assert_array_equal(adjusted, ref_adjusted)  # exact, -inf included
    np.testing.assert_array_equal(dist > 0, ref_dist > 0)  # the same support, exactly
    np.testing.assert_allclose(dist, ref_dist, rtol=0, atol=1e-6)
    np.testing.assert_allclose(dist.sum(-1), 1.0, atol=1e-5)
    return dist


@pytest.mark.parametrize("name", sorted(COMBOS))
@pytest.mark.parametrize("case_seed", [0, 1, 2])
def test_chain_matches_reference(name, case_seed):
    logits, history, appended = random_case(case_seed)
    check_against_reference(COMBOS[name], logits, history, appended)


@pytest.mark.parametrize("name", ["defaults", "top_k_only", "all_filters", "min_keep_3", "xtc_always", "typical_only"])
def test_chain_matches_reference_with_ties(name):
    for case_seed in (3, 4):
        logits, history, appended = random_case(case_seed, ties=True)
        check_against_reference(COMBOS[name], logits, history, appended)


def test_top_k_breaks_ties_by_lower_token_id():
    logits = np.zeros((1, V), dtype=np.float32)
    logits[0, [10, 20, 30, 40]] = 5.0
    params = replace(BASE, top_k=2, top_p=1.0, min_p=0.0, temperature=1.0)
    dist = check_against_reference(params, logits, [], [])
    assert np.flatnonzero(dist[0]).tolist() == [10, 20]
    np.testing.assert_allclose(dist[0, [10, 20]], 0.5, atol=1e-7)


def test_all_banned_but_one_is_one_hot():
    bias = {t: float("-inf") for t in range(V) if t != 17}
    for params in (replace(BASE, logit_bias=bias), replace(BASE, logit_bias=bias, top_k=0, typical_p=0.5, xtc_probability=1.0)):
        logits, history, appended = random_case(5)
        dist = check_against_reference(params, logits, history, appended)
        assert (dist[:, 17] == 1.0).all()
        chain = SamplerChain(params, vocab_size=V)
        assert chain.select(mx.array(logits), history, appended, seed=3) == [17] * logits.shape[0]


def test_ignore_eos_bans_every_eos_id():
    logits = np.zeros((2, V), dtype=np.float32)
    logits[:, list(EOS)] = 50.0
    params = replace(BASE, ignore_eos=True, top_k=0, top_p=1.0, min_p=0.0)
    dist = check_against_reference(params, logits, [], [1])
    assert (dist[:, list(EOS)] == 0).all()
    greedy = SamplerChain(replace(params, temperature=0.0), vocab_size=V, eos_token_ids=EOS)
    assert all(t not in EOS for t in greedy.select(mx.array(logits), [], [1]))


def test_row_i_sees_the_drafts_before_it():
    """Block row i == a single-row call with history + appended[:i], bit for bit, and the
    block's draws equal the one-row draws at the same absolute positions."""
    params = COMBOS["everything"]
    chain = SamplerChain(params, vocab_size=V, eos_token_ids=EOS)
    logits, history, appended = random_case(7, rows=6)
    x = mx.array(logits)
    block = np.array(chain.distribution(x, history, appended, seed=5, first_position=100))
    block_tokens = chain.select(x, history, appended, seed=5, first_position=100)
    for i in range(len(logits)):
        single = np.array(chain.distribution(x[i : i + 1], history + appended[:i], seed=5, first_position=100 + i))
        np.testing.assert_array_equal(block[i], single[0])
        assert chain.select(x[i : i + 1], history + appended[:i], seed=5, first_position=100 + i) == [block_tokens[i]]
        assert sample(mx.array(block[i]), position_key(5, 100 + i)) == block_tokens[i]


def test_appended_changes_penalties_per_row():
    """A drafted token earlier in the block is penalised in the rows after it, not before."""
    params = replace(BASE, presence_penalty=5.0, top_k=0, top_p=1.0, min_p=0.0)
    chain = SamplerChain(params, vocab_size=V)
    logits = np.zeros((3, V), dtype=np.float32)
    adjusted = np.array(chain.adjusted_logits(mx.array(logits), [1], [42, 43]))
    assert adjusted[0, 42] == 0 and adjusted[1, 42] == -5 and adjusted[2, 42] == -5
    assert adjusted[0, 43] == 0 and adjusted[1, 43] == 0 and adjusted[2, 43] == -5
    assert (adjusted[:, 1] == -5).all()


def test_greedy_is_argmax_of_adjusted_logits_and_draws_nothing():
    logits, history, appended = random_case(8, rows=4, ties=True)
    for params in (replace(COMBOS["everything"], temperature=0.0), replace(COMBOS["everything"], top_k=1)):
        chain = SamplerChain(params, vocab_size=V, eos_token_ids=EOS)
        ref_adjusted, _ = reference_block(logits, history, appended, params, eos_ids=EOS)
        expected = [int(np.argmax(r)) for r in ref_adjusted]  # first maximum: ties -> lower id
        calls = []
        original = chain.distribution
        chain.distribution = lambda *a, **k: calls.append(1) or original(*a, **k)  # a spy, not a stub
        state = np.array(mx.random.state[0])
        for seed in (0, 1, 2**31):
            assert chain.select(mx.array(logits), history, appended, seed=seed, first_position=9) == expected
        assert calls == []
        np.testing.assert_array_equal(np.array(mx.random.state[0]), state)  # the global stream is untouched
        dist = np.array(original(mx.array(logits), history, appended))
        assert (dist.argmax(-1) == expected).all() and (dist.max(-1) == 1.0).all()


def test_same_seed_same_tokens_other_seed_other_tokens():
    params = replace(BASE, top_k=0, top_p=1.0, min_p=0.0, temperature=1.5)
    chain = SamplerChain(params, vocab_size=V)
    logits = mx.array(np.zeros((8, V), dtype=np.float32))  # uniform: every draw is informative
    a = chain.select(logits, [], list(range(7)), seed=1234, first_position=0)
    b = chain.select(logits, [], list(range(7)), seed=1234, first_position=0)
    c = chain.select(logits, [], list(range(7)), seed=1235, first_position=0)
    d = chain.select(logits, [], list(range(7)), seed=1234, first_position=8)
    assert a == b
    assert a != c and a != d


def test_xtc_coin_depends_on_position_only():
    coins = np.array(xtc_coins(77, 10, 5))
    for i in range(5):
        assert np.array(xtc_coins(77, 10 + i, 1))[0] == coins[i]
    assert len(set(coins.tolist())) == 5


def test_token_probs_pre_and_post_sampling():
    params = replace(BASE, temperature=0.7, top_k=3, top_p=1.0, min_p=0.0, logit_bias={0: -100.0})
    chain = SamplerChain(params, vocab_size=V)
    logits, history, appended = random_case(9, rows=2)
    x = mx.array(logits)
    tokens = chain.select(x, history, appended, seed=4, first_position=20)
    pre = chain.token_probs(x, tokens, 5, post_sampling=False, history=history, appended=appended, seed=4, first_position=20)
    post = chain.token_probs(x, tokens, 5, post_sampling=True, history=history, appended=appended, seed=4, first_position=20)
    logs = chain.token_probs(x, tokens, 5, post_sampling=False, log_probs=True)
    p = np.array(chain.distribution(x, history, appended, seed=4, first_position=20))
    for i in range(2):
        raw = np.exp(logits[i] - logits[i].max())
        raw /= raw.sum()
        order = np.lexsort((np.arange(V), -raw))[:5]
        assert [t for t, _ in pre[i].top] == order.tolist()
        np.testing.assert_allclose([q for _, q in pre[i].top], raw[order], atol=1e-6)
        np.testing.assert_allclose(pre[i].prob, raw[tokens[i]], atol=1e-6)
        assert [t for t, _ in logs[i].top] == order.tolist()
        np.testing.assert_allclose([v for _, v in logs[i].top], np.log(raw[order]), atol=1e-5)
        np.testing.assert_allclose(logs[i].prob, np.log(raw[tokens[i]]), atol=1e-5)
        assert len(post[i].top) == 3  # only what p keeps
        assert [t for t, _ in post[i].top] == np.lexsort((np.arange(V), -p[i]))[:3].tolist()
        assert post[i].prob == pytest.approx(float(p[i, tokens[i]]), abs=1e-7) and post[i].prob > 0


def test_defaults_are_llama_servers():
    from captures import CAPTURES

    capture = CAPTURES / "responses" / "completion.txt"
    text = capture.read_text()
    settings = json.loads(text[text.index("{"):])["generation_settings"]
    d = SamplerParams()
    for name in ("top_k", "top_p", "min_p", "typical_p", "xtc_probability", "xtc_threshold", "repeat_last_n",
                 "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
                 "dry_allowed_length", "dry_penalty_last_n", "min_keep", "ignore_eos"):
        assert getattr(d, name) == pytest.approx(settings[name], abs=1e-6), name
    assert list(d.dry_sequence_breakers) == settings["dry_sequence_breakers"]
    assert d.temperature == pytest.approx(0.8)


def test_top_p_boundary_is_inclusive_of_the_token_that_reaches_p():
    """Four equal logits (p = 0.25 each, exact in float32): top_p 0.5 keeps exactly two."""
    logits = np.full((1, 4), 1.0, dtype=np.float32)
    params = replace(BASE, top_k=0, top_p=0.5, min_p=0.0, temperature=1.0)
    chain = SamplerChain(params, vocab_size=4)
    dist = np.array(chain.distribution(mx.array(logits), []))
    assert dist[0].tolist() == [0.5, 0.5, 0.0, 0.0]


def test_typical_boundary_needs_mass_strictly_above_p():
    """Four equal logits: typical_p 0.5 is reached, not exceeded, after two -> keeps three."""
    logits = np.full((1, 4), 1.0, dtype=np.float32)
    params = replace(BASE, top_k=0, top_p=1.0, min_p=0.0, typical_p=0.5, temperature=1.0)
    chain = SamplerChain(params, vocab_size=4)
    dist = np.array(chain.distribution(mx.array(logits), []))
    np.testing.assert_allclose(dist[0], [1 / 3, 1 / 3, 1 / 3, 0.0], atol=1e-7)


def test_token_probs_with_zero_n_reports_only_the_chosen_token():
    chain = SamplerChain(BASE, vocab_size=V)
    logits, _, _ = random_case(10, rows=1)
    (tp,) = chain.token_probs(mx.array(logits), [5], 0, post_sampling=False)
    assert tp.top == [] and tp.token == 5 and 0 < tp.prob < 1
