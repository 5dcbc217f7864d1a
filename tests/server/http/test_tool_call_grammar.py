"""The grammar that forces tool calls (``tool_calls.call_grammar``), run by the engine's matcher on a
tiny checkpoint whose vocabulary has ``<tool_call>`` / ``</tool_call>`` as special tokens, in two
Qwen-style layouts the template probe learns: the calls of a turn a newline apart (as Qwen2.5's
template writes them) and back to back (``qwen_tool_template``).

* with parallel calls allowed, every complete call may be the last: end-of-sequence is allowed right
  after it and after the few blank characters a model may write before stopping (the newline its
  template puts between two calls above all), and another call may still follow; the blank run is
  bounded;
* without parallel calls, only end-of-sequence (or those blank characters) follows the one call.

A model that wrote that newline used to be held to a next call: Qwen2.5-Coder-1.5B with
``tool_choice: "required"`` repeated its call until ``max_tokens``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny_checkpoints
from qwen_tool_template import qwen_tool_template

from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.grammar import LARK, compile_grammar, special_token_ids
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, new_matcher
from mlxcel.server.http.chat.template_caps import probe_template
from mlxcel.server.http.chat.tool_calls import call_grammar

# calls a newline apart, in Qwen2.5's layout (our own minimal template)
NEWLINE_APART = """{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}
{%- for call in message.tool_calls or [] %}{% if not loop.first %}{{ '\\n' }}{% endif %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
TEMPLATES = {"newline apart": (NEWLINE_APART, "\n"), "back to back": (qwen_tool_template(), "")}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def lm(checkpoints_root):
    path = tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-llama-tool-tags", "llama", seed=7,
                                                extra_special=("<tool_call>", "</tool_call>"))
    return load_model(path)


def forced(lm, template: str, parallel: bool):
    layout = probe_template(lm.tokenizer, template).call_layout
    text = call_grammar(layout, [WEATHER], "required", parallel=parallel,
                        special_ids=special_token_ids(lm.tokenizer))
    return new_matcher(compile_grammar(LARK, text), lm.tokenizer, lm.vocab_size, lm.eos_token_ids)


def ids(lm, text: str) -> list[int]:
    return list(lm.tokenizer.encode(text, add_special_tokens=False))


def allowed(lm, matcher) -> set[int]:
    row = np.array(allowed_rows(matcher.masks()[:1], lm.vocab_size))[0]
    return set(np.nonzero(row)[0].tolist())


def advance(lm, matcher, text: str) -> None:
    tokens = ids(lm, text)
    assert matcher.admissible(tokens) == len(tokens), f"{text!r} is outside the grammar"
    matcher.advance(tokens)


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_complete_parallel_call_may_be_the_last(lm, name):
    template, between = TEMPLATES[name]
    assert probe_template(lm.tokenizer, template).call_layout.between.endswith(between + '<tool_call>\n{"name": "')
    eos = set(lm.eos_token_ids)
    next_call = lm.tokenizer.convert_tokens_to_ids("<tool_call>")
    matcher = forced(lm, template, parallel=True)
    advance(lm, matcher, CALL)
    assert eos <= allowed(lm, matcher)
    # the blank characters a template puts between two calls: the model may still stop there
    advance(lm, matcher, "\n")
    assert eos <= allowed(lm, matcher) and next_call in allowed(lm, matcher)
    advance(lm, matcher, CALL.replace("Paris", "Rome"))
    assert eos <= allowed(lm, matcher)
    # a bounded run of blank characters, then only the end (or a next call)
    advance(lm, matcher, "\n\n  ")
    assert allowed(lm, matcher) <= eos | {next_call}


@pytest.mark.parametrize("name", TEMPLATES)
def test_one_call_without_parallel_calls(lm, name):
    matcher = forced(lm, TEMPLATES[name][0], parallel=False)
    advance(lm, matcher, CALL)
    next_call = lm.tokenizer.convert_tokens_to_ids("<tool_call>")
    assert set(lm.eos_token_ids) <= allowed(lm, matcher) and next_call not in allowed(lm, matcher)
    advance(lm, matcher, "\n")
    assert next_call not in allowed(lm, matcher) and set(lm.eos_token_ids) <= allowed(lm, matcher)
