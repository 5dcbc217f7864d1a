"""The Anthropic Messages format (``/v1/messages``): ``message`` bodies, their event stream and
Anthropic's error shape.

The output is read as a chat completion's is (``chat.output``) and becomes content blocks in the
order they appear: ``thinking`` (with the empty ``signature`` a local model can give, as
upstream), ``text``, one ``tool_use`` per call (its arguments parsed into ``input``). One
:class:`ContentBlocks` builds them for both shapes. The stream is Anthropic's: ``message_start``
(with the prompt's usage), a ``ping``, then per block ``content_block_start``, its
``text_delta`` / ``thinking_delta`` (closed by a ``signature_delta``) / ``input_json_delta``
events and ``content_block_stop`` (each block closed before the next opens, as Anthropic streams;
upstream closes them all at the end), then ``message_delta`` (``stop_reason``, ``stop_sequence``
and the final usage) and ``message_stop``. Silences of ``sse_ping_interval`` send ``ping``
events.

``stop_reason``: ``end_turn``, ``max_tokens``, ``tool_use``, and ``stop_sequence`` when one of
``stop_sequences`` ended it (upstream says ``end_turn`` then). Usage counts the prompt's cached
tokens as ``cache_read_input_tokens`` and the rest as ``input_tokens``, as upstream. No
``timings`` (upstream sends none on this API). Errors are Anthropic's ``{"type": "error",
"error": {"type", "message"}}`` with the same HTTP status; in a stream, an ``error`` event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from mlxcel.server.http.api.anthropic.request import translate
from mlxcel.server.http.chat.output import ChatOutput, ChatParsing, Delta
from mlxcel.server.http.chat.tool_calls import ToolCall
from mlxcel.server.http.formats.base import CompletionStream, ResponseFormat
from mlxcel.server.http.formats.ids import new_id
from mlxcel.server.http.plan import CompletionPlan, chat_plan
from mlxcel.server.http.sse import named_event
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.runtime.task import Partial, Result

# llama-server's error types -> Anthropic's (the HTTP status stays)
ERROR_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "exceed_context_size_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "unavailable_error": "overloaded_error",
}


def error_body(error: ApiError) -> dict:
    """Anthropic's error body for ``error``."""
    kind = "request_too_large" if error.status == 413 else ERROR_TYPES.get(error.type, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


@dataclass
class AnthropicPlan(CompletionPlan):
    message_id: str = ""


def anthropic_plan(state: ServerState, body: dict, t_arrival: float) -> AnthropicPlan:
    plan = chat_plan(state, translate(body), t_arrival)
    return AnthropicPlan(**vars(plan), message_id=new_id("msg_"))


def stop_reason(result: Result, called: bool) -> str:
    if result.stop_type == "limit":
        return "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if result.stop_type == "word" else "end_turn"


def usage(result: Result) -> dict:
    cached = result.timings.cache_n
    return {"input_tokens": result.n_prompt - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": result.n_predicted}


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class ContentBlocks:
    """The content blocks of one message, built from the settled deltas of its text; each method
    returns the stream events that built what it added."""

    def __init__(self):
        self.blocks: list[dict] = []
        self.open: str | None = None  # "thinking" or "text": the block still taking text
        self.calls = 0

    def feed(self, delta: Delta) -> list[dict]:
        events: list[dict] = []
        if delta.reasoning:
            self._text("thinking", delta.reasoning, events)
        if delta.content:
            self._text("text", delta.content, events)
        for call in delta.tool_calls:
            self._call(call, events)
        return events

    def close(self) -> list[dict]:
        if self.open is None:
            return []
        index, events = len(self.blocks) - 1, []
        if self.open == "thinking":  # Anthropic's clients expect a signature before the block ends
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta", "signature": ""}})
        events.append({"type": "content_block_stop", "index": index})
        self.open = None
        return events

    def _text(self, kind: str, text: str, events: list[dict]) -> None:
        if self.open != kind:
            events += self.close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            self.blocks.append(block)
            events.append({"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)})
            self.open = kind
        self.blocks[-1][kind] += text
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
            {"type": "text_delta", "text": text}
        events.append({"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta})

    def _call(self, call: ToolCall, events: list[dict]) -> None:
        events += self.close()
        self.calls += 1
        self.blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)})
        index = len(self.blocks) - 1
        events.append({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}})
        events.append({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": call.arguments}})
        events.append({"type": "content_block_stop", "index": index})


def message_body(state: ServerState, plan: AnthropicPlan, result: Result) -> dict:
    out = ChatOutput(plan.chat or ChatParsing())
    blocks = ContentBlocks()
    blocks.feed(out.feed(result.content))
    blocks.feed(out.finish())
    return {"id": plan.message_id, "type": "message", "role": "assistant", "model": state.model_name,
            "content": blocks.blocks, "stop_reason": stop_reason(result, blocks.calls > 0),
            "stop_sequence": result.stopping_word if result.stop_type == "word" else None, "usage": usage(result)}


class AnthropicFormat(ResponseFormat):
    def plan(self, state: ServerState, body: dict, t_arrival: float) -> AnthropicPlan:
        return anthropic_plan(state, body, t_arrival)

    def body(self, state: ServerState, plan: CompletionPlan, results: list[Result], indices: list[int]) -> dict:
        return message_body(state, plan, results[0])

    def stream(self, state: ServerState, plan: CompletionPlan, indices: list[int]) -> CompletionStream:
        return AnthropicStream(state, plan)


class AnthropicStream(CompletionStream):
    """Anthropic's message events (see the module doc)."""

    ping = named_event("ping", {"type": "ping"})

    def __init__(self, state: ServerState, plan: AnthropicPlan):
        self.state = state
        self.plan = plan
        self.output = ChatOutput(plan.chat or ChatParsing())
        self.blocks = ContentBlocks()

    def frame(self, chunk: dict) -> bytes:
        return named_event(chunk["type"], chunk)

    def opening(self) -> list[dict]:
        n_prompt = len(self.plan.prompts[0])
        message = {"id": self.plan.message_id, "type": "message", "role": "assistant", "model": self.state.model_name,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": n_prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                             "output_tokens": 0}}
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def partial(self, index: int, partial: Partial) -> list[dict]:
        return self.blocks.feed(self.output.feed(partial.text)) if partial.text else []

    def final(self, index: int, result: Result) -> list[dict]:
        events = self.blocks.feed(self.output.finish()) + self.blocks.close()
        events.append({"type": "message_delta",
                       "delta": {"stop_reason": stop_reason(result, self.blocks.calls > 0),
                                 "stop_sequence": result.stopping_word if result.stop_type == "word" else None},
                       "usage": usage(result)})
        events.append({"type": "message_stop"})
        return events

    def failed(self, error: ApiError) -> list[dict]:
        return [error_body(error)]
