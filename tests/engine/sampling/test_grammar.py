"""Grammar-constrained decoding in the engine, on the tiny llama checkpoint's real tokenizer and model.

* grammars compile from GBNF, Lark, JSON Schema and regex, and a bad one is a ``GrammarError`` with
  llguidance's reason; ``strict`` refuses schema keywords that cannot be enforced;
* a matcher's masks for a drafted block equal the masks of advancing token by token, it never moves
  while asked, and it rolls back exactly;
* the mask is applied after the bias and before the filters: top-k picks among allowed tokens, p has
  no mass outside them, and a grammar that completes allows only end-of-sequence;
* every constrained output parses and validates, for 100 seeds each, plain decoding at temperature 1
  (a JSON schema through pydantic, a GBNF grammar through the regex it describes), and ends with
  finish reason "stop".
"""

from __future__ import annotations

import re
from typing import Literal

import mlx.core as mx
import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import GBNF, JSON_SCHEMA, LARK, REGEX, GrammarError, compile_grammar
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, fill_masks, new_matcher
from mlxcel.engine.sampling.params import SamplerParams

SEEDS = range(100)


class Pet(BaseModel):
    """A schema whose every instance is short (so a random model finishes it), compact JSON."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"x-guidance": {"whitespace_flexible": False}})
    id: str = Field(max_length=3)
    k: Literal["cat", "dog", "fox"]
    n: int = Field(ge=0, le=30)
    ok: bool


PET_SCHEMA = Pet.model_json_schema()
SUM_GBNF = 'root ::= num (" + " num){0,3} " = " num\nnum ::= [1-9] [0-9]?'
SUM_RE = re.compile(r"[1-9][0-9]?( \+ [1-9][0-9]?){0,3} = [1-9][0-9]?")


@pytest.fixture(scope="module")
def lm(tiny_llama):
    return tiny_llama


def matcher(lm, grammar):
    return new_matcher(grammar, lm.tokenizer, lm.vocab_size, lm.eos_token_ids)


def ids(lm, text: str) -> list[int]:
    return list(lm.tokenizer.encode(text, add_special_tokens=False))


def allowed_ids(mask_row: np.ndarray, vocab: int) -> set[int]:
    return set(np.nonzero(np.array(allowed_rows(mask_row[None], vocab))[0])[0].tolist())


# -- compiling ------------------------------------------------------------------------------------


def test_every_source_compiles_and_bad_ones_say_why():
    assert compile_grammar(GBNF, 'root ::= "a" | "b"').kind == GBNF
    assert compile_grammar(GBNF, 'start: "a" | "b"').compiled  # Lark given as a grammar is taken as Lark
    assert compile_grammar(LARK, 'start: %json {"type": "integer"}').compiled
    assert compile_grammar(JSON_SCHEMA, '{"type": "object"}').source == '{"type":"object"}'
    assert compile_grammar(REGEX, r"[0-9]{3}").compiled
    for kind, source, reason in [(GBNF, "root ::= this is (not valid", "Expected"), (GBNF, "root ::= x", "x"),
                                 (JSON_SCHEMA, {"type": "hiccup"}, "hiccup"), (JSON_SCHEMA, 5, "object or boolean"),
                                 (JSON_SCHEMA, "{not json", "not JSON"), (REGEX, "(", "unclosed")]:
        with pytest.raises(GrammarError, match=reason):
            compile_grammar(kind, source)


def test_strict_refuses_what_cannot_be_enforced_and_lenient_ignores_it():
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    assert compile_grammar(JSON_SCHEMA, schema).compiled
    with pytest.raises(GrammarError, match="uniqueItems"):
        compile_grammar(JSON_SCHEMA, schema, strict=True)


# -- the matcher ------------------------------------------------------------------------------------


def test_block_masks_equal_token_by_token_masks_and_the_matcher_never_moves(lm):
    g = compile_grammar(JSON_SCHEMA, PET_SCHEMA)
    text = '{"id":"Rex","k":"dog","n":7,"ok":true}'
    tokens = ids(lm, text)
    m = matcher(lm, g)
    assert m.admissible(tokens) == len(tokens) and m.admissible(tokens + ids(lm, ",")) == len(tokens)
    block = m.masks(tokens[:-1])
    assert m.consumed == 0 and m.admissible(tokens) == len(tokens)  # asking moved nothing
    step = matcher(lm, g)
    for i, t in enumerate(tokens):
        assert np.array_equal(block[i], step.masks()[0]), i
        assert t in allowed_ids(block[i], lm.vocab_size)
        step.advance([t])
    assert step.stopped and step.accepting
    assert allowed_ids(step.masks()[0], lm.vocab_size) == set(lm.eos_token_ids)  # only the end can follow
    step.rollback(3)
    assert not step.stopped and step.admissible(tokens[-3:]) == 3
    # many matchers at once: the same rows as one by one
    together = fill_masks([(m, ()), (step, tokens[-3:-1])])
    assert np.array_equal(together[0], m.masks()) and np.array_equal(together[1], step.masks(tokens[-3:-1]))
    with pytest.raises(GrammarError):
        matcher(lm, g).advance(ids(lm, "}"))  # a token the grammar forbids is never recorded silently


# -- the mask in the sampler chain -----------------------------------------------------------------


def test_the_mask_sits_after_the_bias_and_before_the_filters(lm):
    vocab = lm.vocab_size
    logits = mx.array(np.random.default_rng(0).normal(size=(1, vocab)).astype(np.float32))
    allowed_set = {5, 17, 40, 41, 200}
    allowed = mx.array(np.isin(np.arange(vocab), list(allowed_set)))[None]
    best_allowed = max(allowed_set, key=lambda t: logits[0, t].item())
    greedy = SamplerChain(SamplerParams(temperature=0.0), vocab_size=vocab)
    assert greedy.select(logits, [], allowed=allowed) == [best_allowed]
    # top_k = 1 keeps the best *allowed* token, not the best token (which the mask then empties)
    top1 = SamplerChain(SamplerParams(temperature=1.0, top_k=1), vocab_size=vocab)
    assert top1.select(logits, [], allowed=allowed) == [best_allowed]
    # a bias can still move the choice among the allowed tokens
    biased = SamplerChain(SamplerParams(temperature=0.0, logit_bias={41: 100.0}), vocab_size=vocab)
    assert biased.select(logits, [], allowed=allowed) == [41]
    for params in (SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), SamplerParams(temperature=0.7),
                   SamplerParams(temperature=1.0, typical_p=0.5, top_k=0)):
        p = np.array(SamplerChain(params, vocab_size=vocab).distribution(logits, [], allowed=allowed))[0]
        assert set(np.nonzero(p)[0].tolist()) <= allowed_set and p.sum() == pytest.approx(1.0, abs=1e-5)
    post = SamplerChain(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), vocab_size=vocab)
    (probs,) = post.token_probs(logits, [best_allowed], 10, post_sampling=True, allowed=allowed)
    assert {t for t, _ in probs.top} <= allowed_set


# -- constrained outputs are valid, seed after seed ---------------------------------------------------


def constrained(lm, grammar, seed: int, prompt: list[int], n: int = 64) -> tuple[str, str | None]:
    chain = SamplerChain(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed),
                         vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
    steps = list(generate_tokens(lm.model, prompt, chain, cache=lm.make_cache(), max_tokens=n, seed=seed,
                                 grammar=matcher(lm, grammar)))
    tokens = [s.token for s in steps if s.token not in lm.eos_token_ids]
    return lm.tokenizer.decode(tokens), steps[-1].finish_reason


def test_every_json_output_validates_for_100_seeds(lm):
    g = compile_grammar(JSON_SCHEMA, PET_SCHEMA)
    prompt = ids(lm, "The quick brown fox")
    for seed in SEEDS:
        text, finish = constrained(lm, g, seed, prompt)
        assert finish == "stop", (seed, text)
        Pet.model_validate_json(text)


def test_every_gbnf_output_matches_for_100_seeds(lm):
    g = compile_grammar(GBNF, SUM_GBNF)
    prompt = ids(lm, "one two three")
    for seed in SEEDS:
        text, finish = constrained(lm, g, seed, prompt)
        assert finish == "stop" and SUM_RE.fullmatch(text), (seed, text)
