"""The pieces under the chat route's tool calls and reasoning, without a server: what the
template probe learns from a template, calls read back in each kind of layout, the streamed
split holding markup back, the reasoning budget's state machine, and the grammar that forces a
call (parsed by llguidance when it is installed)."""

from __future__ import annotations

import json

import pytest
import tiny_checkpoints
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import AutoTokenizer

from mlxcel.server.http.chat.output import ChatOutput, ChatParsing
from mlxcel.server.http.chat.template_caps import ThinkMarkers, probe_template
from mlxcel.server.http.chat.tool_calls import call_grammar, call_syntax
from mlxcel.server.runtime.reasoning_budget import COUNTING, DONE, FORCING, IDLE, BudgetSpec, ReasoningBudget

HEADER = ("{%- for m in messages %}{%- if m.role == 'assistant' %}<|im_start|>assistant\n"
          "{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}")
FOOTER = ("<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
          "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = "{% for t in tools or [] %}{{ t.function.name }}\n{% endfor %}"
# three call layouts no family list needs to know: a bare JSON object, a tag-wrapped JSON object in
# a list, and a split one (name, then JSON arguments)
BARE = (TOOLS + HEADER + "{% for tc in m.tool_calls or [] %}{\"name\": \"{{ tc.function.name }}\", "
        "\"parameters\": {{ tc.function.arguments | tojson }}}{% endfor %}" + FOOTER)
LISTED = (TOOLS + HEADER + "{% if m.tool_calls %}<calls>[{% for tc in m.tool_calls %}{% if not loop.first %}, "
          "{% endif %}{\"function\": {\"name\": \"{{ tc.function.name }}\", \"args\": "
          "{{ tc.function.arguments | tojson }}}, \"id\": \"{{ tc.id }}\"}{% endfor %}]</calls>{% endif %}" + FOOTER)
SPLIT = (TOOLS + HEADER + "{% for tc in m.tool_calls or [] %}<<call>>{{ tc.function.name }}<<args>>"
         "{{ tc.function.arguments | tojson }}<<end>>{% endfor %}" + FOOTER)
HERMES = (TOOLS + HEADER + "{% for tool_call in m.tool_calls or [] %}{% set tool_call = tool_call.function %}"
          "<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}\n"
          "</tool_call>{% endfor %}" + FOOTER)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    tiny_checkpoints.build_tokenizer(out)
    return TokenizerWrapper(AutoTokenizer.from_pretrained(str(out)))


def read(parsing: ChatParsing, text: str, step: int = 1):
    """Feed ``text`` ``step`` characters at a time: (reasoning, content, calls, the deltas)."""
    out = ChatOutput(parsing)
    deltas = [out.feed(text[i:i + step]) for i in range(0, len(text), step)] + [out.finish()]
    return out.reasoning, out.content, [(c.name, json.loads(c.arguments)) for c in out.tool_calls], deltas


@pytest.mark.parametrize("template,text,source", [
    (BARE, '{"name": "get_weather", "parameters": {"city": "Paris"}}', "layout"),
    (LISTED, '<calls>[{"function": {"name": "get_weather", "args": {"city": "Paris"}}, "id": "abc"}, '
             '{"function": {"name": "get_time", "args": {}}, "id": "abd"}]</calls>', "layout"),
    (SPLIT, "<<call>>get_weather<<args>>{\"city\": \"Paris\"}<<end>><<call>>get_time<<args>>{}<<end>>", "layout"),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "mlx-lm json_tools"),
])
def test_calls_are_read_in_the_layout_the_template_renders(tokenizer, template, text, source):
    info = probe_template(tokenizer, template)
    assert info.caps["supports_tools"] and info.caps["supports_tool_calls"] and info.object_arguments
    syntax = call_syntax(template, tokenizer, info)
    assert syntax is not None and syntax.source.startswith("mlx-lm" if source.startswith("mlx-lm") else "the")
    parsing = ChatParsing(calls=syntax, tools=[WEATHER])
    reasoning, content, calls, deltas = read(parsing, "Let me look. " + text if template is not BARE else text)
    expected = [("get_weather", {"city": "Paris"})] + ([("get_time", {})] if "get_time" in text else [])
    assert calls == expected
    assert content == ("" if template is BARE else "Let me look. ")
    assert all("<" not in d.content and "{" not in d.content for d in deltas)  # markup never leaked
    assert read(parsing, text, step=len(text))[2] == calls  # whole or streamed: the same calls
    sent = [i for i, d in enumerate(deltas) for _ in d.tool_calls]
    if len(sent) == 2:
        assert sent[0] < sent[1]  # a call goes out once it is complete, not at the end


def test_text_that_only_looks_like_a_call_stays_content(tokenizer):
    syntax = call_syntax(SPLIT, tokenizer, probe_template(tokenizer, SPLIT))
    parsing = ChatParsing(calls=syntax)
    reasoning, content, calls, _ = read(parsing, "see <<call>>not json here")
    assert calls == [] and content == "see <<call>>not json here"
    assert read(parsing, "a << b, and done")[1] == "a << b, and done"


def test_the_probe_reads_think_tags_and_capabilities_from_the_template(tokenizer):
    info = probe_template(tokenizer, HERMES)
    assert info.think == ThinkMarkers("<think>", "</think>")
    assert info.caps["supports_parallel_tool_calls"] and info.caps["supports_system_role"]
    bracket = HEADER.replace("<think>", "[THINK]").replace("</think>", "[/THINK]") + FOOTER
    assert probe_template(tokenizer, bracket).think == ThinkMarkers("[THINK]", "[/THINK]")
    plain = probe_template(tokenizer, tiny_checkpoints.CHATML_TEMPLATE)
    assert plain.think is None and not plain.caps["supports_tools"] and not plain.caps["supports_tool_calls"]
    assert call_syntax(tiny_checkpoints.CHATML_TEMPLATE, tokenizer, plain) is None


def test_reasoning_is_split_and_its_end_tag_held_back():
    think = ThinkMarkers("<think>", "</think>")
    text = "<think>\n plan it \n</think>\n\nThe answer."
    for step in (1, 3, len(text)):
        reasoning, content, _, deltas = read(ChatParsing(think=think), text, step)
        assert (reasoning, content) == ("plan it", "The answer.")
        assert not any("<" in d.reasoning or "<" in d.content for d in deltas)
    opened = ChatParsing(think=think, open_thinking=True)
    assert read(opened, "still thinking</think>done")[:2] == ("still thinking", "done")
    assert read(opened, "never closed")[:2] == ("never closed", "")
    assert read(ChatParsing(think=think), "no thinking at all")[:2] == ("", "no thinking at all")


def test_the_budget_counts_from_the_start_tag_and_forces_the_end_tag():
    spec = BudgetSpec(tokens=2, start=(10,), ends=((11,),), forced=(20, 11))
    b = ReasoningBudget(spec)
    assert b.state == IDLE and b.forced is None and b.round_limit() == 3
    b.accept(10)
    assert b.state == COUNTING and b.round_limit() == 2
    b.accept(1)
    assert b.round_limit() == 1
    b.accept(2)
    assert b.state == FORCING and b.forced == 20 and b.round_limit() == 1
    b.accept(20)
    assert b.forced == 11
    b.accept(11)
    assert b.state == DONE and b.forced is None
    b.accept(10)  # a new block gets a fresh budget
    assert b.state == COUNTING and b.remaining == 2
    b.accept(11)  # the model's own end tag ends it
    assert b.state == DONE


def test_the_budget_counts_the_generation_prompt_and_waits_for_a_whole_character():
    opened = ReasoningBudget(BudgetSpec(tokens=0, start=(10,), ends=((11,),), forced=(11,), prefill=(5, 10)))
    assert opened.forced == 11  # a zero budget forces the end tag at once
    partial = ReasoningBudget(BudgetSpec(tokens=1, start=(10,), ends=((11,),), forced=(11,)),
                              complete=lambda t: t != 7)
    partial.accept(10)
    partial.accept(7)  # half a character: the tag waits
    assert partial.forced is None and partial.round_limit() == 1
    partial.accept(8)
    assert partial.forced == 11


def test_the_grammar_forcing_a_call_is_written_in_the_templates_layout(tokenizer):
    layout = probe_template(tokenizer, HERMES).call_layout
    grammar = call_grammar(layout, [WEATHER], "required", parallel=True)
    assert grammar.startswith('start: "<tool_call>\\n{\\"name\\": \\"" call')
    assert '%json{"type":"object","properties":{"city":{"type":"string"}}' in grammar
    assert '"get_weather"' in grammar and "(" in grammar  # several calls joined by the layout's separator
    named = call_grammar(layout, [WEATHER, {"type": "function", "function": {"name": "other"}}],
                         {"name": "other"})
    assert '"other"' in named and '"get_weather"' not in named
    ids = call_grammar(probe_template(tokenizer, LISTED).call_layout, [WEATHER], "required", parallel=True)
    assert "CALL_ID" in ids

    llguidance = pytest.importorskip("llguidance")
    ll_hf = pytest.importorskip("llguidance.hf")
    ll_tok = ll_hf.from_tokenizer(tokenizer._tokenizer)

    def accepts(grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(ll_tok, llguidance.grammar_from("lark", grammar))
        assert not matcher.is_error(), matcher.get_error()
        ok = matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False))
        return ok and matcher.is_accepting()

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(grammar, call)
    assert accepts(grammar, call + call)  # this template writes two calls with nothing between them
    assert not accepts(grammar, call.replace('"city"', '"town"'))
    assert not accepts(grammar, "Sure! " + call)


def test_a_bare_call_object_as_the_whole_output_is_a_call_when_it_names_a_tool(tokenizer):
    # small models drop the tags their template writes (Qwen2.5-Coder-0.5B answers the bare object)
    syntax = call_syntax(HERMES, tokenizer, probe_template(tokenizer, HERMES))
    parsing = ChatParsing(calls=syntax, tools=[WEATHER])
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert read(parsing, bare)[1:3] == ("", [("get_weather", {"city": "Paris"})])
    other = '{"name": "launch", "arguments": {}}'
    assert read(parsing, other)[1:3] == (other, [])
    assert read(parsing, "Sure: " + bare)[1:3] == ("Sure: " + bare, [])  # only as the whole output
    assert read(parsing, bare + " and more")[1:3] == (bare + " and more", [])
