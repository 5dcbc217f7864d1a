"""Tool calls and reasoning end to end: a real server on a scripted tiny checkpoint
(``scripted_model``: its greedy output is known), driven by the official ``openai`` client.

Two templates of our own, in two conventions: a Qwen-style one (``<tool_call>`` JSON calls, which
mlx-lm's ``json_tools`` parser reads, and ``<think>`` tags the model writes), served with prompt
lookup speculating; and one whose generation prompt opens a ``[THINK]`` block (tags no list
names: they come from the template).
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
import scripted_model
from qwen_tool_template import qwen_tool_template
from server_process import ServerProcess

openai = pytest.importorskip("openai")

QWEN_STYLE = qwen_tool_template()

THINK_OPEN = """{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.role == "assistant" and message.reasoning_content %}[THINK]{{ message.reasoning_content }}[/THINK]{% endif %}{{ message.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking %}[THINK]{% endif %}{% endif %}"""

# after its call the model writes a blank line, then ends its turn (or, that line banned, calls again)
CALL = ["<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "</tool_call>", "\n\n", "<|im_end|>"]
THOUGHTS = [" one", " two", " three", " four", " five", " six"]
THINK = ["<think>", *THOUGHTS, "</think>", "\n\nIt is sunny in Paris.", "<|im_end|>"]
ANSWER = ["Plain", " answer.", "<|im_end|>"]
OPEN_THINK = ["[THINK]", "Let me see.", "[/THINK]", "Answer B.", "<|im_end|>"]
# after the generation prompt ("...assistant\n"): a call, else (banned) thinking, else an answer
BRANCHES = {"\n": [("<tool_call>", 1.0), ("<think>", 0.8), ("Plain", 0.6)], "</tool_call>": [("<tool_call>", 0.5)]}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_CALL = {"<tool_call>": -100}
NO_CALL_NO_THINK = {"<tool_call>": -100, "<think>": -100}


@pytest.fixture(scope="module")
def scripted_dir(checkpoints_root):
    return scripted_model.build_scripted_checkpoint(checkpoints_root / "scripted", QWEN_STYLE,
                                                    [CALL, THINK, ANSWER, OPEN_THINK], BRANCHES)


@pytest.fixture(scope="module")
def qwen_style(scripted_dir):
    proc = ServerProcess("-m", str(scripted_dir), "-c", "1024", "-np", "2", "--temp", "0",
                         "--spec-type", "ngram-simple")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def think_open(scripted_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("templates") / "think_open.jinja"
    template.write_text(THINK_OPEN)
    proc = ServerProcess("-m", str(scripted_dir), "-c", "512", "-np", "1", "--temp", "0",
                         "--chat-template-file", str(template))
    yield proc
    proc.stop()


def client(proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=60)


def stream_message(proc, **kw) -> tuple[dict, list[dict], str]:
    """A streamed chat completion reassembled as OpenAI's clients do: (message, deltas, finish)."""
    content, reasoning, calls, deltas, finish = "", "", {}, [], None
    for chunk in client(proc).chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            delta = choice.delta.model_dump(exclude_none=True)
            deltas.append(delta)
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.get("id") or ""
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice.finish_reason or finish
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)]}, deltas, finish


def test_props_reports_what_each_template_can_do(qwen_style, think_open):
    caps = httpx.get(qwen_style.url + "/props").json()["chat_template_caps"]
    assert caps["supports_tools"] and caps["supports_tool_calls"] and caps["supports_parallel_tool_calls"]
    assert caps["supports_object_arguments"] and caps["supports_system_role"] and caps["supports_string_content"]
    caps = httpx.get(think_open.url + "/props").json()["chat_template_caps"]
    assert not caps["supports_tools"] and not caps["supports_tool_calls"] and caps["supports_string_content"]


def test_a_tool_call_round_trip(qwen_style):
    oai = client(qwen_style)
    first = oai.chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content in ("", None)
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and len(call.id) >= 8
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    history = [*USER, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}]
    prompt = httpx.post(qwen_style.url + "/apply-template",
                        json={"messages": history, "tools": [WEATHER]}).json()["prompt"]
    # the history's call as the template writes it (arguments given as a JSON string, rendered as an object)
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
            and '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in prompt and '"get_weather"' in prompt)
    tokens = httpx.post(qwen_style.url + "/v1/chat/completions/input_tokens",
                        json={"messages": history, "tools": [WEATHER]}).json()["input_tokens"]
    without_tools = httpx.post(qwen_style.url + "/v1/chat/completions/input_tokens",
                               json={"messages": history}).json()["input_tokens"]
    assert tokens > without_tools
    # the scripted model answers once its call token is banned
    second = oai.chat.completions.create(model="m", messages=history, tools=[WEATHER], logit_bias=NO_CALL_NO_THINK)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "Plain answer."
    assert not second.choices[0].message.tool_calls


def test_streamed_tool_call_deltas_reassemble_to_the_call(qwen_style):
    whole = client(qwen_style).chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    message, deltas, finish = stream_message(qwen_style, model="m", messages=USER, tools=[WEATHER])
    assert finish == "tool_calls"
    assert message["content"] == "" and "tool_call" not in json.dumps([d.get("content") for d in deltas])
    (call,) = message["calls"]
    ref = whole.choices[0].message.tool_calls[0]
    assert (call["name"], call["arguments"]) == (ref.function.name, ref.function.arguments)
    assert call["id"]


def test_tool_choice_none_reads_no_call_and_required_forces_one(qwen_style):
    none = client(qwen_style).chat.completions.create(model="m", messages=USER, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].finish_reason == "stop" and not none.choices[0].message.tool_calls
    assert none.choices[0].message.content.startswith("<tool_call>")
    # required / a named function: a grammar forces a call in the template's own layout (on this
    # speculating server), even where the model would answer in text (its call and thinking tokens
    # banned), with arguments the tool's schema allows
    cities = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    tool = {"type": "function", "function": {**WEATHER["function"], "parameters": cities}}
    auto = client(qwen_style).chat.completions.create(model="m", messages=USER, tools=[tool], logit_bias=NO_CALL_NO_THINK)
    assert not auto.choices[0].message.tool_calls
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        got = client(qwen_style).chat.completions.create(model="m", messages=USER, tools=[tool], tool_choice=choice,
                                                         logit_bias=NO_CALL_NO_THINK)
        assert got.choices[0].finish_reason == "tool_calls", got.choices[0]
        (call,) = got.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    bad = httpx.post(qwen_style.url + "/v1/chat/completions",
                     json={"messages": USER, "tools": [WEATHER], "tool_choice": "sometimes"})
    assert bad.status_code == 400 and "Invalid tool_choice" in bad.json()["error"]["message"]


def test_required_with_parallel_calls_ends_after_a_complete_call(qwen_style):
    """Parallel calls allowed (this template can render them, so they are by default): the model
    writes a blank line after its call and ends its turn, which the forcing grammar allows after
    every complete call (it used to hold the model to call after call, until ``max_tokens``). The
    arguments are the grammar's to choose: one city, compact JSON."""
    cities = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    tool = {"type": "function", "function": {**WEATHER["function"], "parameters": cities}}
    kw = {"model": "m", "messages": USER, "tools": [tool], "tool_choice": "required", "max_tokens": 60}
    choice = client(qwen_style).chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    assert not choice.message.content
    message, _, finish = stream_message(qwen_style, **kw)
    assert finish == "tool_calls" and len(message["calls"]) == 1 and not message["content"]


BAD_TOOLS = [  # (route, body, what the 400 says): every shape of tools / tool_choice, on each route that has them
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": "get_weather"}},
     "'function' must be an object with a 'name' string"),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": 5}}}, "'name' string"),
    ("/v1/chat/completions", {"tool_choice": {"type": "custom", "custom": {"name": "get_weather"}}},
     "the type 'custom' is not supported"),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "no tool named 'nope'"),
    ("/v1/chat/completions", {"tool_choice": ["auto"]}, "Invalid tool_choice: expected"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": "get_weather"}]}, "tool 0 must be an object"),
    ("/v1/chat/completions", {"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "unsupported type 'retrieval'"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "x", "parameters": "y"}}]},
     "must be a JSON schema object"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": "sometimes"},
     "Invalid tool_choice: sometimes"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f"}],
                       "tool_choice": {"type": "function", "name": "g"}}, "no tool named 'g'"),
    ("/v1/messages", {"max_tokens": 4, "tools": [{"name": "f"}], "tool_choice": {"type": "tool", "name": "g"}},
     "no tool named 'g'"),
]


@pytest.mark.parametrize("path,body,message", BAD_TOOLS, ids=[str(i) for i in range(len(BAD_TOOLS))])
def test_every_bad_tools_shape_is_a_clear_400(qwen_style, path, body, message):
    if path != "/v1/responses":
        body = {"messages": USER, "tools": [WEATHER], "max_tokens": 4, **body}
    r = httpx.post(qwen_style.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and message in r.json()["error"]["message"]
    assert httpx.get(qwen_style.url + "/health", timeout=10).status_code == 200


def test_think_tags_written_by_the_model_split_final_and_streamed(qwen_style):
    kw = {"model": "m", "messages": USER, "logit_bias": NO_CALL}
    whole = client(qwen_style).chat.completions.create(**kw).choices[0].message
    assert whole.reasoning_content == "one two three four five six"
    assert whole.content == "It is sunny in Paris."
    message, deltas, _ = stream_message(qwen_style, **kw)
    assert (message["reasoning"], message["content"]) == (whole.reasoning_content, whole.content)
    assert not any("think>" in (d.get("content") or "") + (d.get("reasoning_content") or "") for d in deltas)
    raw = client(qwen_style).chat.completions.create(**kw, extra_body={"reasoning_format": "none"}).choices[0].message
    assert raw.content == "<think> one two three four five six</think>\n\nIt is sunny in Paris."
    assert getattr(raw, "reasoning_content", None) is None


def test_a_thinking_block_the_generation_prompt_opens_splits_too(think_open):
    whole = client(think_open).chat.completions.create(model="m", messages=USER).choices[0].message
    assert (whole.reasoning_content, whole.content) == ("Let me see.", "Answer B.")
    message, _, _ = stream_message(think_open, model="m", messages=USER)
    assert (message["reasoning"], message["content"]) == ("Let me see.", "Answer B.")


@pytest.mark.parametrize("field", ["thinking_budget_tokens", "reasoning_budget_tokens"])
def test_a_reasoning_budget_forces_the_end_tag_exactly_under_speculation(qwen_style, field):
    # the prompt holds the whole scripted answer, so prompt lookup drafts past the budget
    script = "".join(THINK[:-1])
    messages = [{"role": "user", "content": f"Say {script} please"}]
    base = {"messages": messages, "logit_bias": NO_CALL, "temperature": 0, field: 3, "return_tokens": True}
    spec = httpx.post(qwen_style.url + "/v1/chat/completions", json={**base, "verbose": True}, timeout=60).json()
    plain = httpx.post(qwen_style.url + "/v1/chat/completions",
                       json={**base, "verbose": True, "speculative.n_max": 0}, timeout=60).json()
    message = spec["choices"][0]["message"]
    assert message["reasoning_content"] == "one two three"
    assert message["content"] == "It is sunny in Paris."
    assert spec["__verbose"]["tokens"] == plain["__verbose"]["tokens"]
    assert spec["timings"].get("draft_n", 0) > 0  # it did speculate
    unlimited = httpx.post(qwen_style.url + "/v1/chat/completions",
                           json={**base, field: -1}, timeout=60).json()["choices"][0]["message"]
    assert unlimited["reasoning_content"] == "one two three four five six"


def test_a_zero_budget_ends_a_prompt_opened_block_at_once(think_open):
    got = httpx.post(think_open.url + "/v1/chat/completions",
                     json={"messages": USER, "reasoning_budget_tokens": 0}, timeout=60).json()
    message = got["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"] == "Answer B."


def test_a_grammar_applies_to_the_answer_after_the_thinking(qwen_style, think_open):
    """The thoughts stay free and the constraint holds for what follows them: the same grammar from
    the first token would forbid the thinking block (and did, before it was placed after it)."""
    grammar = 'root ::= "Answer " [AB] "."'
    got = client(think_open).chat.completions.create(model="m", messages=USER, extra_body={"grammar": grammar})
    assert (got.choices[0].message.reasoning_content, got.choices[0].message.content) == ("Let me see.", "Answer B.")
    # a thinking block the model opens itself (text tags), then an answer the grammar steers away from the script
    kw = {"model": "m", "messages": USER, "logit_bias": NO_CALL, "extra_body": {"grammar": 'root ::= "It is " [a-z]+ "."'}}
    message = client(qwen_style).chat.completions.create(**kw).choices[0].message
    assert message.reasoning_content == "one two three four five six"
    assert re.fullmatch(r"It is [a-z]+\.", message.content), message.content
    raw = httpx.post(qwen_style.url + "/v1/chat/completions", json={
        "messages": USER, "logit_bias": NO_CALL, "grammar": 'root ::= "It is " [a-z]+ "."',
        "reasoning_format": "none"}, timeout=60).json()
    assert raw["choices"][0]["message"]["content"].startswith("It is ")  # unsplit reasoning: constrained from the start
