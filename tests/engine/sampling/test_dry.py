"""Penalties and DRY: hand-worked cases, the NumPy reference on random repetitive sequences,
and string -> token sequence breakers through a real tokenizer."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from sampler_reference import reference_block, reference_breakers

from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.dry import DryBreakers, breakers_from_strings, dry_penalties, vocab_texts
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.sampling.penalties import block_windows

V = 32
OFF = SamplerParams(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)


def adjusted(params, history, appended=(), rows=1, logits=None, breakers=None):
    chain = SamplerChain(params, vocab_size=V, dry_breakers=breakers)
    x = mx.zeros((rows, V)) if logits is None else mx.array(logits)
    return np.array(chain.adjusted_logits(x, history, appended))


def test_repeat_presence_frequency_by_hand():
    logits = np.array([[2.0, -2.0, 1.0, 0.0] + [0.0] * (V - 4)], dtype=np.float32)
    p = replace(OFF, repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=64)
    out = adjusted(p, [0, 1, 1], logits=logits)
    assert out[0, 0] == 2.0 / 2 - (1 * 0.5 + 0.25)
    assert out[0, 1] == -2.0 * 2 - (2 * 0.5 + 0.25)
    assert out[0, 2] == 1.0 and out[0, 3] == 0.0


def test_repeat_window_counts_only_the_last_n_tokens():
    p = replace(OFF, frequency_penalty=1.0, repeat_last_n=3)
    out = adjusted(p, [5, 5, 5, 6, 7, 5])  # window: 6 7 5
    assert out[0, 5] == -1.0 and out[0, 6] == -1.0 and out[0, 7] == -1.0
    assert adjusted(replace(p, repeat_last_n=-1), [5, 5, 5, 6, 7, 5])[0, 5] == -4.0
    assert (adjusted(replace(p, repeat_last_n=0), [5, 5, 5])[0] == 0).all()


def test_block_windows_slide_over_the_drafts():
    w = block_windows([1, 2, 3, 4], [5, 6], rows=3, last_n=3, pad=-1)
    assert w.tolist() == [[2, 3, 4], [3, 4, 5], [4, 5, 6]]
    w = block_windows([1], [5, 6], rows=3, last_n=-1, pad=-1)
    assert w.tolist() == [[-1, -1, 1], [-1, 1, 5], [1, 5, 6]]


DRY = replace(OFF, dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2, dry_penalty_last_n=-1)


def test_dry_by_hand():
    # "5 6" repeats the start; 7 followed it there -> 7 would extend a length-2 repeat: 1 * 2^0.
    assert dry_penalties(np.array([5, 6, 7, 5, 6]), DryBreakers(), 1.0, 2.0, 2) == {7: 1.0}
    # "5 6 7" repeats: 8 would make it four long: 2^(3-2).
    assert dry_penalties(np.array([5, 6, 7, 8, 5, 6, 7]), DryBreakers(), 1.0, 2.0, 2) == {8: 2.0}
    # a repeat shorter than allowed_length is free
    assert dry_penalties(np.array([5, 6, 7, 5, 6]), DryBreakers(), 1.0, 2.0, 3) == {}
    # the newest token is a breaker: nothing may repeat across it
    seven = DryBreakers.from_sequences([[7]])
    assert dry_penalties(np.array([5, 6, 7, 8, 5, 6, 7]), seven, 1.0, 2.0, 2) == {}
    # a breaker three tokens back caps the repeat at 3: 2^1 instead of 2^2
    nine = DryBreakers.from_sequences([[9]])
    assert dry_penalties(np.array([9, 5, 6, 7, 8, 9, 5, 6, 7]), DryBreakers(), 1.0, 2.0, 2) == {8: 4.0}
    assert dry_penalties(np.array([9, 5, 6, 7, 8, 9, 5, 6, 7]), nine, 1.0, 2.0, 2) == {8: 2.0}
    assert dry_penalties(np.array([5, 6, 7, 8, 9, 6, 7]), nine, 1.0, 2.0, 2) == {8: 1.0}
    # single-token breakers are never penalised themselves
    assert dry_penalties(np.array([5, 6, 9, 1, 5, 6]), nine, 1.0, 2.0, 2) == {}
    # a multi-token breaker "3 4" only counts when the whole sequence is present
    three_four = DryBreakers.from_sequences([[3, 4]])
    assert dry_penalties(np.array([5, 6, 7, 3, 5, 6]), three_four, 1.0, 2.0, 2) == {7: 1.0}
    assert dry_penalties(np.array([3, 7, 5, 6, 9, 3, 7, 5, 6]), three_four, 1.0, 2.0, 2) == {9: 4.0}
    assert dry_penalties(np.array([3, 4, 5, 6, 9, 3, 4, 5, 6]), three_four, 1.0, 2.0, 2) == {9: 1.0}


def test_dry_window_and_drafts_in_the_chain():
    p = replace(DRY, dry_penalty_last_n=4)
    assert (adjusted(p, [5, 6, 7, 1, 2, 5, 6]) == 0).all()  # 5 6 7 is outside the window
    out = adjusted(DRY, [5, 6, 7, 1, 2], appended=[5, 6], rows=3)
    assert out[0, 7] == 0 and out[1, 7] == 0 and out[2, 7] == -1.0


def random_dry_case(seed):
    rng = np.random.default_rng(seed)
    alphabet = int(rng.integers(3, 7))
    history = rng.integers(0, alphabet, size=int(rng.integers(0, 60))).tolist()
    appended = rng.integers(0, alphabet, size=4).tolist()
    logits = rng.normal(size=(5, V)).astype(np.float32)
    return logits, history, appended


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("combo", [
    dict(dry_allowed_length=2, dry_penalty_last_n=-1, dry_base=1.75),
    dict(dry_allowed_length=1, dry_penalty_last_n=12, dry_base=1.0),
    dict(dry_allowed_length=3, dry_penalty_last_n=64, dry_base=3.0, dry_multiplier=0.5),
    dict(dry_allowed_length=0, dry_penalty_last_n=20, dry_base=1e6),  # exponent clamp
])
def test_dry_matches_reference(seed, combo):
    params = replace(DRY, **combo)
    breakers = {1: {()}, 2: {(0,), (0, 3)}}
    logits, history, appended = random_dry_case(seed)
    chain = SamplerChain(params, vocab_size=V,
                         dry_breakers=DryBreakers({h: tuple(sorted(t)) for h, t in breakers.items()}))
    got = np.array(chain.adjusted_logits(mx.array(logits), history, appended))
    want, _ = reference_block(logits, history, appended, params, breakers=breakers)
    np.testing.assert_array_equal(got, want)


def test_dry_long_repetition_is_penalised_exponentially():
    seq = [4, 5] * 40
    out = adjusted(replace(DRY, dry_base=1.5), seq)
    assert out[0, 4] < -1e5  # ~1.5^(79-2)
    assert np.isfinite(out).all()


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return tiny_llama.tokenizer


def test_breakers_from_strings_match_brute_force(tokenizer):
    vocab = len(tokenizer._tokenizer)
    strings = ("\n", ":", '"', "*", "def ", "self.items")
    got = breakers_from_strings(tokenizer, strings, vocab)
    texts = vocab_texts(tokenizer, vocab)
    want = reference_breakers(texts, lambda s: tokenizer.encode(s, add_special_tokens=False), strings)
    assert {h: set(t) for h, t in got.tails.items()} == want
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert len(newline) == 1 and newline[0] in got.single_tokens
    assert any(len(t) > 0 for ts in got.tails.values() for t in ts)  # multi-token tails occur
    assert breakers_from_strings(tokenizer, strings, vocab) is got  # cached


def test_chain_derives_breakers_from_the_tokenizer(tokenizer):
    vocab = len(tokenizer._tokenizer)
    ids = tokenizer.encode("ab\nab", add_special_tokens=False)
    chain = SamplerChain(replace(DRY, dry_allowed_length=1), vocab_size=vocab, tokenizer=tokenizer)
    x = mx.zeros((1, vocab))
    a, nl = ids[0], tokenizer.encode("\n", add_special_tokens=False)[0]
    hist = [a, nl, a]
    assert np.array(chain.adjusted_logits(x, hist))[0, nl] == 0.0  # never penalise a breaker
    plain = SamplerChain(replace(DRY, dry_allowed_length=1), vocab_size=vocab, tokenizer=None)
    assert np.array(plain.adjusted_logits(x, hist))[0, nl] == -1.0


def test_dry_exponent_is_clamped_to_stay_finite():
    out = adjusted(replace(DRY, dry_base=1e6, dry_allowed_length=2), [4, 5] * 40)
    assert out[0, 4] == np.float32(-(1e6**6))  # int(88.7228391 / ln 1e6) = 6
