"""The Responses and Anthropic request translations into chat bodies, and the output builders, as
units (no server): what each input shape becomes, and that a stream's events rebuild the body."""

from __future__ import annotations

import json

import pytest

from mlxcel.server.http.api.anthropic import request as anthropic_request
from mlxcel.server.http.api.anthropic.format import ContentBlocks
from mlxcel.server.http.api.responses import request as responses_request
from mlxcel.server.http.api.responses.format import OutputItems
from mlxcel.server.http.chat.output import Delta
from mlxcel.server.http.chat.tool_calls import ToolCall
from mlxcel.server.http.response_store import ResponseStore, StoredResponse
from mlxcel.server.runtime.errors import ApiError

CALL = ToolCall("get_weather", '{"city": "Paris"}', "abc123")


def test_responses_items_become_turns():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
    ]
    chat, req = responses_request.translate({"input": items, "instructions": "sys", "max_output_tokens": 7,
                                             "reasoning": {"effort": "low"}, "top_k": 3}, ResponseStore())
    assert chat["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "Be brief."},  # developer -> system, as upstream maps it
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "hm",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    assert (chat["max_tokens"], chat["reasoning_effort"], chat["top_k"]) == (7, "low", 3)
    assert "input" not in chat and "instructions" not in chat and req.id.startswith("resp_")
    assert req.conversation == chat["messages"][1:]  # instructions are not part of what a follow-up continues


def test_previous_response_id_prepends_the_stored_history_without_its_instructions():
    store = ResponseStore()
    store.put("resp_1", StoredResponse({"id": "resp_1"}, [{"role": "user", "content": "q"}],
                                       {"role": "assistant", "content": "a"}))
    chat, req = responses_request.translate({"input": "next", "previous_response_id": "resp_1",
                                             "instructions": "new"}, store)
    assert chat["messages"] == [{"role": "system", "content": "new"}, {"role": "user", "content": "q"},
                                {"role": "assistant", "content": "a"}, {"role": "user", "content": "next"}]
    with pytest.raises(ApiError) as err:
        responses_request.translate({"input": "x", "previous_response_id": "resp_2"}, store)
    assert err.value.status == 404


def test_the_store_is_bounded_by_count():
    store = ResponseStore(capacity=2)
    for i in range(3):
        store.put(f"r{i}", StoredResponse({}))
    assert "r0" not in store and "r1" in store and "r2" in store and len(store) == 2


def test_responses_tools_and_choices():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    other = {"type": "web_search"}
    chat, _ = responses_request.translate({"input": "x", "tools": [tool, other],
                                           "tool_choice": {"type": "function", "name": "f"}}, ResponseStore())
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                               "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    narrowed, _ = responses_request.translate(
        {"input": "x", "tools": [tool, {**tool, "name": "g"}],
         "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "g"}]}},
        ResponseStore())
    assert [t["function"]["name"] for t in narrowed["tools"]] == ["g"] and narrowed["tool_choice"] == "required"
    fmt, _ = responses_request.translate({"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                                                           "schema": {"type": "object"}}}},
                                         ResponseStore())
    assert fmt["response_format"] == {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}


def test_sealed_reasoning_round_trips():
    sealed = responses_request.seal_reasoning("think ✓")
    chat, _ = responses_request.translate({"input": [{"type": "reasoning", "summary": [], "encrypted_content": sealed},
                                                     {"role": "user", "content": "q"}]}, ResponseStore())
    assert chat["messages"][0] == {"role": "assistant", "content": "", "reasoning_content": "think ✓"}


def test_output_items_stream_events_rebuild_the_items():
    req = responses_request.ResponsesRequest(id="resp_x", conversation=[])
    items = OutputItems(req)
    events = items.feed(Delta(reasoning="hm"))
    events += items.feed(Delta(reasoning=" more", content="Hi"))
    events += items.feed(Delta(content=" there", tool_calls=[CALL]))
    events += items.close()
    rebuilt: dict[int, dict] = {}
    for ev in events:
        if ev["type"] == "response.output_item.done":
            rebuilt[ev["output_index"]] = ev["item"]
    assert [rebuilt[i] for i in sorted(rebuilt)] == items.items
    kinds = [i["type"] for i in items.items]
    assert kinds == ["reasoning", "message", "function_call"]
    assert items.items[0]["content"] == [{"type": "reasoning_text", "text": "hm more"}]
    assert items.items[1]["content"][0]["text"] == "Hi there"
    assert items.items[2]["call_id"] == "call_abc123" and json.loads(items.items[2]["arguments"]) == {"city": "Paris"}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Hi there"
    assert items.reply() == {"role": "assistant", "content": "Hi there", "reasoning_content": "hm more", "tool_calls": [
        {"id": "call_abc123", "type": "function", "function": {"name": "get_weather", "arguments": CALL.arguments}}]}


def test_anthropic_blocks_become_chat_messages_in_order():
    chat = anthropic_request.translate({
        "max_tokens": 9, "stop_sequences": ["END"], "top_k": 2,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12c; rest"},
                   {"type": "text", "text": "You are helpful."}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 64},
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                              {"type": "text", "text": "calling"},
                                              {"type": "tool_use", "id": "tu_1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                                          "content": [{"type": "text", "text": "r1"}]},
                                         {"type": "text", "text": "and?"}]}]})
    assert chat["messages"] == [
        {"role": "system", "content": "x-anthropic-billing-header: cc_version=1; cch=fffff; rest\n\nYou are helpful."},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "calling"}], "reasoning_content": "t",
         "tool_calls": [{"id": "tu_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "tu_1", "content": "r1"},
        {"role": "user", "content": [{"type": "text", "text": "and?"}]},
    ]
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "description": "d",
                                                               "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert (chat["parallel_tool_calls"], chat["stop"], chat["max_tokens"], chat["top_k"]) == (False, ["END"], 9, 2)
    assert chat["thinking_budget_tokens"] == 64 and chat["chat_template_kwargs"] == {"enable_thinking": True}


@pytest.mark.parametrize("body, needle", [
    ({"messages": [{"role": "user", "content": "q"}]}, "max_tokens: Field required"),
    ({"max_tokens": 1}, "messages: Field required"),
    ({"max_tokens": 1, "messages": []}, "at least one message"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "q"}]}, "at least 1"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "an image block's 'source' must be of type 'base64' or 'url'"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "q"}], "tool_choice": {"type": "some"}},
     "tool_choice"),
    # a field of the chat request the translation reads must have its type checked first (a list or
    # a string here was a ValueError, a 500 outside Anthropic's error shape)
    *[({"max_tokens": 1, "messages": [{"role": "user", "content": "q"}], "thinking": {"type": kind},
        "chat_template_kwargs": kwargs}, "Field 'chat_template_kwargs': type must be object")
      for kind in ("enabled", "disabled") for kwargs in ([["a", 1]], "abc", 5, True)],
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "q"}], "tools": [{"name": "f", "description": [1]}]},
     "tools.0: 'description' must be a string"),
])
def test_anthropic_refusals(body, needle):
    with pytest.raises(ApiError) as err:
        anthropic_request.translate(body)
    assert err.value.status == 400 and needle in err.value.message


@pytest.mark.parametrize("body, needle", [
    ({"input": "q", "tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": ["f"]}]}},
     "allowed_tools"),  # an unhashable name was a TypeError
    ({"input": "q", "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [5]}}, "allowed_tools"),
    ({"input": "q", "reasoning": {"effort": 5}}, "Field 'effort': type must be string"),
    ({"input": "q", "max_tool_calls": -1}, "Field 'max_tool_calls': Value must be between 0"),
    ({"input": "q", "max_tool_calls": 1e308}, "Field 'max_tool_calls': Value must be between 0"),
])
def test_responses_refusals(body, needle):
    with pytest.raises(ApiError) as err:
        responses_request.translate(body, ResponseStore())
    assert err.value.status == 400 and needle in err.value.message


def test_content_blocks_stream_events_close_each_block_before_the_next():
    blocks = ContentBlocks()
    events = blocks.feed(Delta(reasoning="t"))
    events += blocks.feed(Delta(content="Hi", tool_calls=[CALL]))
    events += blocks.close()
    opened, order = set(), []
    for ev in events:
        if ev["type"] == "content_block_start":
            assert not opened, "a block opened before the previous one stopped"
            opened.add(ev["index"])
            order.append(ev["content_block"]["type"])
        elif ev["type"] == "content_block_stop":
            opened.discard(ev["index"])
    assert order == ["thinking", "text", "tool_use"] and not opened
    assert blocks.blocks == [{"type": "thinking", "thinking": "t", "signature": ""}, {"type": "text", "text": "Hi"},
                             {"type": "tool_use", "id": "abc123", "name": "get_weather", "input": {"city": "Paris"}}]
    assert [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"] == [
        "thinking_delta", "signature_delta", "text_delta", "input_json_delta"]
