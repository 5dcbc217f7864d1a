"""The OpenAI Responses API and the Anthropic Messages API end to end: one real server on a scripted
tiny checkpoint (``scripted_model``: its greedy output is known), driven by the official
``openai`` and ``anthropic`` clients, with an API key (the openai client sends it as a bearer
token, the anthropic client as ``x-api-key``).

After the generation prompt the model writes a tool call; with the call banned (``logit_bias``)
a thinking block and an answer; with both banned, ``Plain answer.``.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
import scripted_model
from qwen_tool_template import qwen_tool_template
from server_process import ServerProcess

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

TEMPLATE = qwen_tool_template(answer_hint=False)

CALL = ["<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "</tool_call>", "<|im_end|>"]
THINK = ["<think>", " one", " two", " three", "</think>", "\n\nIt is sunny in Paris.", "<|im_end|>"]
ANSWER = ["Plain", " answer.", "<|im_end|>"]
BRANCHES = {"\n": [("<tool_call>", 1.0), ("<think>", 0.8), ("Plain", 0.6)]}
NO_CALL = {"<tool_call>": -100}
PLAIN = {"<tool_call>": -100, "<think>": -100}
KEY = "sk-test-key"
QUESTION = "What is the weather in Paris?"
FAULT = "engine-fails-here"  # the engine raises on a prompt holding this (MLXCEL_FAULT_INJECT)

OAI_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "The weather in a city",
                  "input_schema": OAI_TOOL["parameters"]}


@pytest.fixture(scope="module")
def server(checkpoints_root):
    model = scripted_model.build_scripted_checkpoint(checkpoints_root / "scripted-apis", TEMPLATE,
                                                     [CALL, THINK, ANSWER], BRANCHES)
    proc = ServerProcess("-m", str(model), "-c", "1024", "-np", "2", "--temp", "0", "--api-key", KEY,
                         "--spec-type", "ngram-simple", env={"MLXCEL_FAULT_INJECT": f"prefill:{FAULT}"})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


def post(server, path, body, key=KEY):
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def bias(tokens):
    return {"logit_bias": tokens}


def named_events(server, path, body) -> list[tuple[str, dict]]:
    """(event name, data) of each event of a stream."""
    r = httpx.post(server.url + path, json={**body, "stream": True}, headers={"x-api-key": KEY}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream", r.text
    out = []
    for frame in r.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    assert all(name == data["type"] for name, data in out)
    return out


# -- Responses ---------------------------------------------------------------------------------

def test_a_plain_response(oai):
    res = oai.responses.create(model="m", input=QUESTION, instructions="Be brief.", extra_body=bias(PLAIN))
    assert res.status == "completed" and res.id.startswith("resp_")
    assert res.output_text == "Plain answer."
    (message,) = res.output
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "completed"
    assert res.usage.output_tokens == 3 and res.usage.input_tokens > 5
    assert res.instructions == "Be brief." and res.store is True


def test_a_streamed_response_follows_the_official_event_order(oai):
    with oai.responses.stream(model="m", input=QUESTION, extra_body=bias(PLAIN)) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Plain answer."
    assert final.output_text == "Plain answer." and final.status == "completed"


def test_a_function_call_and_its_output_follow_up(oai, server):
    first = oai.responses.create(model="m", input=QUESTION, tools=[OAI_TOOL])
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id and call.id.startswith("fc_")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}
    explicit = [{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True), result]
    second = oai.responses.create(model="m", input=explicit, tools=[OAI_TOOL], extra_body=bias(PLAIN))
    assert second.output_text == "Plain answer."
    # previous_response_id continues the stored conversation: the same prompt as the explicit history
    chained = oai.responses.create(model="m", input=[result], previous_response_id=first.id, tools=[OAI_TOOL],
                                   extra_body=bias(PLAIN))
    assert chained.previous_response_id == first.id and chained.output_text == "Plain answer."
    assert chained.usage.input_tokens == second.usage.input_tokens
    count = post(server, "/v1/responses/input_tokens", {"input": [result], "previous_response_id": first.id,
                                                        "tools": [OAI_TOOL]}).json()
    assert count == {"object": "response.input_tokens", "input_tokens": second.usage.input_tokens}


def test_a_streamed_function_call(oai):
    with oai.responses.stream(model="m", input=QUESTION, tools=[OAI_TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done"]
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}


def test_reasoning_becomes_a_reasoning_item_before_the_message(oai):
    res = oai.responses.create(model="m", input=QUESTION, extra_body=bias(NO_CALL))
    reasoning, message = res.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "one two three"
    assert message.type == "message" and res.output_text == "It is sunny in Paris."
    assert res.usage.output_tokens_details.reasoning_tokens > 0
    with oai.responses.stream(model="m", input=QUESTION, extra_body=bias(NO_CALL)) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "one two three"
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert final.output_text == "It is sunny in Paris."


def test_reasoning_items_come_back_into_the_prompt(oai, server):
    res = oai.responses.create(model="m", input=QUESTION, include=["reasoning.encrypted_content"], store=False,
                               extra_body=bias(NO_CALL))
    reasoning, message = res.output
    assert reasoning.encrypted_content  # what a client that does not store hands back
    follow = {"role": "user", "content": "And tomorrow?"}
    sealed = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    plain = {"type": "reasoning", "id": reasoning.id, "summary": [], "content": [
        {"type": "reasoning_text", "text": "one two three"}]}
    base = [{"role": "user", "content": QUESTION}]
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]}

    def count(items):
        return post(server, "/responses/input_tokens", {"input": items}).json()["input_tokens"]

    assert count(base + [sealed, answer, follow]) == count(base + [plain, answer, follow]) > count(
        base + [answer, follow])


def test_stored_responses_by_id(oai, server):
    res = oai.responses.create(model="m", input=QUESTION, metadata={"k": "v"}, extra_body=bias(PLAIN))
    got = oai.responses.retrieve(res.id)
    assert got.output_text == "Plain answer." and got.metadata == {"k": "v"} and got.id == res.id
    assert oai.responses.delete(res.id) is None
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(res.id)
    unstored = oai.responses.create(model="m", input=QUESTION, store=False, extra_body=bias(PLAIN))
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="m", input="again", previous_response_id=unstored.id)
    other = oai.responses.create(model="m", input=QUESTION, extra_body=bias(PLAIN))
    with pytest.raises(openai.BadRequestError, match="background"):
        oai.responses.cancel(other.id)


def test_a_background_response_is_polled_and_can_be_cancelled(oai):
    queued = oai.responses.create(model="m", input=QUESTION, background=True, extra_body=bias(PLAIN))
    assert queued.status == "queued" and queued.background
    deadline = time.monotonic() + 30
    got = oai.responses.retrieve(queued.id)
    while got.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        got = oai.responses.retrieve(queued.id)
    assert got.status == "completed" and got.output_text == "Plain answer."
    long = oai.responses.create(model="m", input=QUESTION, background=True, max_output_tokens=100000,
                                extra_body={"logit_bias": PLAIN, "ignore_eos": True})
    cancelled = oai.responses.cancel(long.id)
    assert cancelled.status == "cancelled" and oai.responses.retrieve(long.id).status == "cancelled"


def test_max_output_tokens_leaves_the_response_incomplete(oai):
    res = oai.responses.create(model="m", input=QUESTION, max_output_tokens=1, extra_body=bias(PLAIN))
    assert res.status == "incomplete" and res.incomplete_details.reason == "max_output_tokens"
    assert res.output_text == "Plain"


def test_responses_refusals_are_clear_400s(server):
    for body, needle in [({}, "'input' is required"), ({"input": 3}, "'input' must be"),
                         ({"input": [{"type": "input_image"}]}, "items of type 'input_image'"),
                         ({"input": [{}]}, "Cannot determine type"),
                         ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                          "image input is not supported - hint: if this is unexpected, you may need to provide the "
                          "mmproj"),
                         ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
                          "'image_url' is required"),
                         ({"input": "x", "truncation": "auto"}, "truncation"),
                         ({"input": "x", "include": ["file_search_call.results"]}, "include"),
                         ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens")]:
        r = post(server, "/v1/responses", body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (body, r.text)
    assert post(server, "/v1/responses", {"input": "x"}, key="wrong").status_code == 401


# -- Anthropic Messages ------------------------------------------------------------------------

def test_a_plain_message(claude):
    msg = claude.messages.create(model="m", max_tokens=50, system="Be brief.",
                                 messages=[{"role": "user", "content": QUESTION}], extra_body=bias(PLAIN))
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Plain answer."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.output_tokens == 3 and msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 5


def test_a_streamed_message(claude):
    with claude.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": QUESTION}],
                                extra_body=bias(PLAIN)) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_stop",
                                      "message_delta", "message_stop")]
    assert raw == ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == "Plain answer." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 3


def test_tool_use_and_its_result(claude):
    ask = [{"role": "user", "content": QUESTION}]
    msg = claude.messages.create(model="m", max_tokens=100, messages=ask, tools=[ANTHROPIC_TOOL])
    assert msg.stop_reason == "tool_use"
    (use,) = msg.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"} and use.id
    with claude.messages.stream(model="m", max_tokens=100, messages=ask, tools=[ANTHROPIC_TOOL]) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].type == "tool_use" and streamed.content[0].input == {"city": "Paris"}
    history = [*ask, {"role": "assistant", "content": [use.model_dump()]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    answer = claude.messages.create(model="m", max_tokens=100, messages=history, tools=[ANTHROPIC_TOOL],
                                    extra_body=bias(PLAIN))
    assert answer.content[0].text == "Plain answer." and answer.stop_reason == "end_turn"
    none = claude.messages.create(model="m", max_tokens=100, messages=ask, tools=[ANTHROPIC_TOOL],
                                  tool_choice={"type": "none"})
    assert none.stop_reason == "end_turn" and none.content[0].text.startswith("<tool_call>")


def test_thinking_blocks(claude):
    ask = [{"role": "user", "content": QUESTION}]
    msg = claude.messages.create(model="m", max_tokens=100, messages=ask, thinking={"type": "enabled",
                                                                                    "budget_tokens": 1000},
                                 extra_body=bias(NO_CALL))
    thinking, text = msg.content
    assert thinking.type == "thinking" and thinking.thinking == "one two three" and thinking.signature == ""
    assert text.text == "It is sunny in Paris."
    with claude.messages.stream(model="m", max_tokens=100, messages=ask, extra_body=bias(NO_CALL)) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == "one two three"


def test_stop_sequences_and_max_tokens(claude):
    ask = [{"role": "user", "content": QUESTION}]
    msg = claude.messages.create(model="m", max_tokens=50, messages=ask, stop_sequences=[" answer"],
                                 extra_body=bias(PLAIN))
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == " answer" and msg.content[0].text == "Plain"
    short = claude.messages.create(model="m", max_tokens=1, messages=ask, extra_body=bias(PLAIN))
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 1


def test_count_tokens(claude):
    ask = [{"role": "user", "content": QUESTION}]
    bare = claude.messages.count_tokens(model="m", messages=ask).input_tokens
    with_tools = claude.messages.count_tokens(model="m", messages=ask, tools=[ANTHROPIC_TOOL]).input_tokens
    assert 5 < bare < with_tools


def test_anthropic_errors_take_anthropic_shape(claude, server):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="m", max_tokens=10, messages=[])
    assert err.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                         "message": "messages: at least one message is required"}}
    r = httpx.post(server.url + "/v1/messages", json={"messages": [{"role": "user", "content": "hi"}]},
                   headers={"x-api-key": KEY})
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens: Field required"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY},
                   json={"max_tokens": 5, "messages": [{"role": "user", "content": [image]}]})
    assert r.status_code == 400 and "image input is not supported" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/messages", json={"max_tokens": 5, "messages": []}, headers={"x-api-key": "no"})
    assert r.status_code == 401


def test_every_field_the_record_calls_refused_is_a_400_naming_it(server):
    from mlxcel.server.cli.compat_api_fields import API_FIELDS

    values = {"truncation": "auto", "top_logprobs": 3, "conversation": "conv_1", "prompt": {"id": "pmpt_1"}, "n": 2,
              "mcp_servers": [{"type": "url", "url": "http://x"}], "container": "c"}
    refused = [(api, field) for api, field, state, _ in API_FIELDS if state == "refused"]
    assert len(refused) >= 7
    for api, field in refused:
        base = {"input": QUESTION} if api == "responses" else {"max_tokens": 5, "messages": [
            {"role": "user", "content": QUESTION}]}
        r = post(server, "/v1/responses" if api == "responses" else "/v1/messages", {**base, field: values[field]})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (api, field, r.text)


def test_an_engine_failure_ends_each_api_in_its_own_shape(server, oai):
    events = named_events(server, "/v1/responses", {"input": FAULT})
    assert [name for name, _ in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert oai.responses.retrieve(failed["id"]).status == "failed"
    events = named_events(server, "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": FAULT}]})
    assert [name for name, _ in events] == ["message_start", "ping", "error"]
    assert events[-1][1]["error"]["type"] == "api_error"
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY},
                   json={"max_tokens": 5, "messages": [{"role": "user", "content": FAULT}]}, timeout=60)
    assert r.status_code == 500 and r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"


# -- Predicted outputs on chat completions, through the official client --------------------------------

THOUGHT = "<think> one two three</think>"
SUNNY = THOUGHT + "\n\nIt is sunny in Paris."


def tokens(server, text: str) -> list[int]:
    return post(server, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]


def test_a_prediction_speeds_the_known_answer_and_is_counted_as_openai_counts_it(oai, server):
    """The scripted answer is seven tokens (``<think>``, `` one``, `` two``, `` three``, ``</think>``, the
    sentence, the end token). Predicting it exactly: the prefill writes the first token, one round verifies
    the other five as drafts, every prediction token is accepted. Predicting it with the sentence changed:
    the five thinking tokens are accepted, the changed sentence's tokens rejected. The answer is the same."""
    ask = dict(model="m", messages=[{"role": "user", "content": QUESTION}], extra_body=bias(NO_CALL))
    plain = oai.chat.completions.create(**ask)
    assert plain.usage.completion_tokens_details is None  # no prediction, no counts (upstream sends none)
    exact = oai.chat.completions.create(**ask, prediction={"type": "content", "content": SUNNY})
    assert exact.choices[0].message.content == plain.choices[0].message.content == "It is sunny in Paris."
    assert len(tokens(server, SUNNY)) == 6
    details = exact.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (6, 0)
    timings = exact.model_extra["timings"]
    assert (timings["draft_kind"], timings["draft_rounds"], timings["draft_n"], timings["draft_n_accepted"]) == (
        "prediction+prompt-lookup", 1, 5, 5)
    cloudy = THOUGHT + "\n\nIt is cloudy in Paris."
    edited = oai.chat.completions.create(**ask, prediction={"type": "content", "content": [
        {"type": "text", "text": THOUGHT}, {"type": "text", "text": "\n\nIt is cloudy in Paris."}]})
    assert edited.choices[0].message.content == "It is sunny in Paris."
    details = edited.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (5, len(tokens(server, cloudy)) - 5)
    stream = oai.chat.completions.create(**ask, prediction={"type": "content", "content": SUNNY}, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "It is sunny in Paris."
    details = chunks[-1].usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (6, 0)


def test_a_bad_prediction_is_a_400_through_the_client(oai):
    for bad, needle in (({"type": "text", "content": "x"}, "type must be 'content'"),
                        ({"type": "content", "content": [{"type": "image_url"}]}, "not a text part"),
                        ({"type": "content", "content": "word " * 2000}, "more than the context")):
        with pytest.raises(openai.BadRequestError) as err:
            oai.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTION}], prediction=bad)
        assert needle in str(err.value), bad
