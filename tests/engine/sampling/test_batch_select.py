"""Many rows drawn in one pass (batch_select) against each row drawn alone (SamplerChain.select), on
a tiny real checkpoint's logits: every sampler shape mixed in one batch, blocks of one row and
verify-style blocks with drafts appended, grammar-constrained rows among them. Zero tolerance."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.sampling import batch_select
from mlxcel.engine.sampling.batch_select import Draw, distribution_draws, pick_draws, select_draws
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import GBNF, compile_grammar
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, new_matcher
from mlxcel.engine.sampling.params import SamplerParams

BASE = SamplerParams()
PARAMS = {
    "greedy": replace(BASE, temperature=0.0),
    "top_k_1": replace(BASE, top_k=1),
    "defaults": BASE,
    "hot": replace(BASE, temperature=1.7),
    "cold": replace(BASE, temperature=0.3),
    "no_filters": replace(BASE, top_k=0, top_p=1.0, min_p=0.0, temperature=1.1),
    "no_filters_other_t": replace(BASE, top_k=0, top_p=1.0, min_p=0.0, temperature=0.6),
    "top_k_5": replace(BASE, top_k=5, top_p=1.0, min_p=0.0),
    "top_p": replace(BASE, top_k=0, top_p=0.6, min_p=0.0),
    "top_p_other": replace(BASE, top_k=0, top_p=0.85, min_p=0.0, temperature=1.2),
    "min_p": replace(BASE, top_k=0, top_p=1.0, min_p=0.2),
    "typical_xtc": replace(BASE, typical_p=0.8, xtc_probability=0.6, xtc_threshold=0.05, min_keep=2),
    "xtc_always": replace(BASE, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.02),
    "penalties": replace(BASE, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3, repeat_last_n=8),
    "penalties_whole": replace(BASE, repeat_penalty=0.8, frequency_penalty=-0.2, repeat_last_n=-1, top_k=0),
    "greedy_penalties": replace(BASE, temperature=0.0, repeat_penalty=1.5, repeat_last_n=16),
    "dry": replace(BASE, dry_multiplier=0.8, dry_penalty_last_n=-1),
    "bias": replace(BASE, logit_bias={5: 3.0, 9: float("-inf")}, ignore_eos=True),
}
TEXTS = ["the quick brown fox", "jumps over the lazy dog and the", "a b c a b c a b", "hello there, hello there"]


@pytest.fixture(scope="module")
def rows(tiny_llama):
    """Real logits: every position of a few prompts, ``[L, V]`` each, with their tokens."""
    out = []
    for text in TEXTS:
        tokens = tiny_llama.tokenizer.encode(text)
        logits = tiny_llama.model(mx.array([tokens]))[0].astype(mx.float32)
        mx.eval(logits)
        out.append((tokens, logits))
    return out


def chain(lm, params) -> SamplerChain:
    return SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids, tokenizer=lm.tokenizer)


def mixed_draws(lm, rows, *, block=1, seed0=0) -> list[Draw]:
    """One draw per sampler, each on its own prompt's logits, seed and position; ``block`` > 1
    makes verify-style blocks (row i sees the history plus ``appended[:i]``)."""
    draws = []
    for n, (name, params) in enumerate(sorted(PARAMS.items())):
        tokens, logits = rows[n % len(rows)]
        rows_n = min(block, logits.shape[0])
        cut = logits.shape[0] - rows_n
        history, appended = tokens[: cut + 1], tokens[cut + 1:]
        draws.append(Draw(chain(lm, params), logits[cut:], history, appended, seed=seed0 + 17 * n,
                          first_position=len(history)))
    return draws


def alone(draw: Draw) -> list[int]:
    return draw.chain.select(draw.logits, draw.history, draw.appended, draw.seed, draw.first_position, draw.allowed)


@pytest.mark.parametrize("block", [1, 3])
@pytest.mark.parametrize("seed0", [0, 1000, 55555])
def test_every_row_gets_the_tokens_it_gets_alone(tiny_llama, rows, block, seed0):
    draws = mixed_draws(tiny_llama, rows, block=block, seed0=seed0)
    together = select_draws(draws)
    assert together == [alone(d) for d in draws]
    # and whatever rows sit beside it: reversed, or in pairs
    assert select_draws(draws[::-1]) == together[::-1]
    for i in range(0, len(draws) - 1, 2):
        assert select_draws(draws[i:i + 2]) == together[i:i + 2]


def test_rows_of_one_shape_with_their_own_values_share_one_graph_and_keep_their_tokens(tiny_llama, rows):
    """Many rows of the default shape with different temperatures / top-p / min-p and seeds: one
    group, each row's own column of values and its own key."""
    tokens, logits = rows[1]
    draws = []
    for i in range(12):
        params = replace(BASE, temperature=0.2 + 0.15 * i, top_p=0.5 + 0.04 * i, min_p=0.01 * (i + 1))
        draws.append(Draw(chain(tiny_llama, params), logits[i % logits.shape[0]], tokens[: i % logits.shape[0] + 1],
                          seed=i, first_position=i % logits.shape[0] + 1))
    assert len({d.chain.shape for d in draws}) == 1
    assert select_draws(draws) == [alone(d) for d in draws]


def test_grammar_constrained_rows_mixed_with_free_ones(tiny_llama, rows):
    grammar = compile_grammar(GBNF, 'root ::= ("the" | "fox" | "dog") (" " ("the" | "fox" | "dog")){2,6} "."')
    draws = mixed_draws(tiny_llama, rows)
    for n, name in enumerate(("greedy", "defaults", "hot", "penalties")):
        matcher = new_matcher(grammar, tiny_llama.tokenizer, tiny_llama.vocab_size, tiny_llama.eos_token_ids)
        tokens, logits = rows[n]
        allowed = allowed_rows(matcher.masks(), tiny_llama.vocab_size)
        draws.insert(2 * n, Draw(chain(tiny_llama, PARAMS[name]), logits[-1], tokens, seed=n, first_position=len(tokens),
                                 allowed=allowed))
    together = select_draws(draws)
    assert together == [alone(d) for d in draws]
    for n in range(4):  # a constrained row's token is one its grammar allows
        assert np.array(draws[2 * n].allowed)[0, together[2 * n][0]]


def test_argmax_draws_and_distributions_equal_their_per_row_ops(tiny_llama, rows):
    draws = mixed_draws(tiny_llama, rows, block=3)
    argmax = [replace(d, argmax=True) for d in draws]
    picks = pick_draws(argmax)
    for d, pick in zip(argmax, picks):
        expected = d.chain.adjusted_logits(d.logits, d.history, d.appended).argmax(axis=-1).tolist()
        assert pick.tolist() == expected
    for d, p in zip(draws, distribution_draws(draws)):
        alone_p = d.chain.distribution(d.logits, d.history, d.appended, d.seed, d.first_position)
        assert np.array_equal(np.array(p), np.array(alone_p)), d.chain.params


def test_one_readback_for_the_whole_batch(tiny_llama, rows, monkeypatch):
    reads = []
    real = batch_select._read
    monkeypatch.setattr(batch_select, "_read", lambda arrays: reads.append(len(arrays)) or real(arrays))
    draws = mixed_draws(tiny_llama, rows)
    select_draws(draws)
    assert reads == [len(draws)]


def test_a_row_that_fails_fails_alone(tiny_llama, rows, monkeypatch):
    draws = mixed_draws(tiny_llama, rows)
    expected = [alone(d) for d in draws]
    bad = replace(draws[3], allowed=mx.ones((1, tiny_llama.vocab_size + 1), dtype=mx.bool_))  # a mask of the wrong width
    got = select_draws(draws[:3] + [bad] + draws[4:])
    assert isinstance(got[3], Exception)
    assert got[:3] + got[4:] == expected[:3] + expected[4:]
    # rows that cannot share a graph (another width) are each drawn alone, and get their own tokens
    defaults = next(d for d in draws if d.chain.params == BASE)
    wide = replace(defaults, logits=mx.concatenate([defaults.logits, defaults.logits[:, :5]], axis=-1))
    assert select_draws(draws + [wide]) == expected + [alone(wide)]
    # the shared evaluation failing: every row is evaluated alone, and still gets its own tokens
    real = batch_select._read
    monkeypatch.setattr(batch_select, "_read",
                        lambda arrays: (_ for _ in ()).throw(RuntimeError("boom")) if len(arrays) > 1 else real(arrays))
    assert select_draws(draws) == expected
