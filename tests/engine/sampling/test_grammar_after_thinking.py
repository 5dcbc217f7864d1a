"""A grammar that starts after the model's thinking (``grammar.after_thinking``), on real tokenizers:
tags that are text (the tiny llama's byte-level BPE spells ``<think>`` in several tokens) and tags that
are one special token each.

* inside the block the thoughts are free (every token of text is allowed, as without a grammar), and after the
  end tag the answer must follow the request's grammar;
* without an opened block the output may start with the start tag or go straight to the answer;
* sampled at temperature 1 from a random model after some thoughts, every answer (50 seeds per
  case) is one the inner grammar accepts, and the request ends when the grammar does.
"""

from __future__ import annotations

import json
import re

import mlx.core as mx  # noqa: F401
import numpy as np
import pytest
import tiny_checkpoints

from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import (
    GBNF,
    JSON_SCHEMA,
    REGEX,
    after_thinking,
    compile_grammar,
    special_token_ids,
)
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, new_matcher
from mlxcel.engine.sampling.params import SamplerParams

SUM_GBNF = 'root ::= num " = " num\nnum ::= [1-9] [0-9]?'
SUM_RE = re.compile(r"[1-9][0-9]? = [1-9][0-9]?")
THOUGHTS = "some thoughts: 12 = 7, or <b>?"


@pytest.fixture(scope="module")
def models(tiny_llama, checkpoints_root):
    path = tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-llama-think", "llama", seed=5,
                                                extra_special=("<think>", "</think>"))
    models = {False: tiny_llama, True: load_model(path)}
    for special, lm in models.items():  # each case is what it says
        assert ("</think>" in special_token_ids(lm.tokenizer)) == special
    return models


def _ids(lm, text):
    return list(lm.tokenizer.encode(text, add_special_tokens=False))


def _tag(lm, special, text):
    return [lm.tokenizer.convert_tokens_to_ids(text)] if special else _ids(lm, text)


def _matcher(lm, grammar):
    return new_matcher(grammar, lm.tokenizer, lm.vocab_size, lm.eos_token_ids)


def _allowed(lm, m) -> set[int]:
    row = np.array(allowed_rows(m.masks(), lm.vocab_size)[0])
    return set(np.flatnonzero(row).tolist())


@pytest.mark.parametrize("special", [False, True], ids=["text-tags", "special-tags"])
def test_the_thoughts_are_free_and_the_answer_is_constrained(models, special):
    lm = models[special]
    grammar = after_thinking(compile_grammar(GBNF, SUM_GBNF), "<think>", "</think>", opened=True,
                             special_ids=special_token_ids(lm.tokenizer))
    m = _matcher(lm, grammar)
    text = _allowed(lm, _matcher(lm, compile_grammar(REGEX, r"(.|\n)*"))) - set(lm.eos_token_ids)  # any text
    end = set(_tag(lm, special, "</think>")[:1]) if special else set()
    assert _allowed(lm, m) == text | end
    m.advance(_ids(lm, THOUGHTS))
    assert _allowed(lm, m) == text | end
    m.advance(_tag(lm, special, "</think>") + _ids(lm, "\n"))
    answer = _allowed(lm, m)
    assert 1 <= len(answer) < 40, answer  # digits (and whitespace) only
    m.advance(_ids(lm, "12 = 34"))
    assert m.accepting


@pytest.mark.parametrize("special", [False, True], ids=["text-tags", "special-tags"])
def test_without_an_opened_block_the_output_may_think_or_answer(models, special):
    lm = models[special]
    grammar = after_thinking(compile_grammar(GBNF, SUM_GBNF), "<think>", "</think>", opened=False,
                             special_ids=special_token_ids(lm.tokenizer))
    first = _allowed(lm, _matcher(lm, grammar))
    assert _tag(lm, special, "<think>")[0] in first
    assert _ids(lm, "7")[0] in first
    assert _ids(lm, "x")[0] not in first  # neither a thought nor an answer may start without the tag
    direct = _matcher(lm, grammar)
    direct.advance(_ids(lm, "1 = 2"))
    assert direct.accepting


@pytest.mark.parametrize("special", [False, True], ids=["text-tags", "special-tags"])
def test_every_sampled_answer_after_thoughts_is_valid(models, special):
    lm = models[special]
    grammar = after_thinking(compile_grammar(GBNF, SUM_GBNF), "<think>", "</think>", opened=False,
                             special_ids=special_token_ids(lm.tokenizer))
    thought = _tag(lm, special, "<think>") + _ids(lm, THOUGHTS) + _tag(lm, special, "</think>")
    prompt = _ids(lm, "The sum")
    for seed in range(50):
        m = _matcher(lm, grammar)
        m.advance(thought)  # as if the model had thought this
        chain = SamplerChain(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed),
                             vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
        steps = list(generate_tokens(lm.model, prompt + thought, chain, cache=lm.make_cache(), max_tokens=24,
                                     seed=seed, grammar=m))
        text = lm.tokenizer.decode([s.token for s in steps if s.token not in lm.eos_token_ids])
        assert steps[-1].finish_reason == "stop", (seed, text)
        assert SUM_RE.fullmatch(text.strip()), (seed, text)


def test_a_schema_after_thinking(models):
    lm = models[False]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    grammar = after_thinking(compile_grammar(JSON_SCHEMA, schema), "<think>", "</think>", opened=True, special_ids={})
    m = _matcher(lm, grammar)
    m.advance(_ids(lm, THOUGHTS + "</think>"))
    m.advance(_ids(lm, '{"a":12}'))
    assert m.accepting and json.loads('{"a":12}')["a"] == 12
    bad = _matcher(lm, grammar)
    bad.advance(_ids(lm, THOUGHTS + "</think>"))
    assert bad.admissible(_ids(lm, '{"b":1}')) < len(_ids(lm, '{"b":1}'))
