"""The OpenAI Responses format (``/v1/responses``): ``response`` objects and the ``response.*``
event stream.

The output is read as a chat completion's is (``chat.output``: reasoning, content, tool calls)
and becomes output items in the order they appear: a ``reasoning`` item (its text as one
``reasoning_text`` part), a ``message`` with one ``output_text`` part, a ``function_call`` per
call. One :class:`OutputItems` builds them for both shapes, so a stream's events always reassemble
to the body. Events follow the official API's order, each with its ``sequence_number``:
``response.created``, ``response.in_progress``; per item ``response.output_item.added``, for a
text item ``response.content_part.added``, its ``*.delta`` events, ``*.done``,
``response.content_part.done``, for a call ``response.function_call_arguments.delta`` / ``.done``;
``response.output_item.done``; then ``response.completed``, or ``response.incomplete`` when
``max_output_tokens`` (or the context) cut it short (upstream says completed either way).

llama-server's extensions ride where upstream puts them: ``timings`` on the last event of each
``timings_per_token`` step and beside ``response`` in the final event, ``prompt_progress`` on
``response.in_progress`` events; the non-streamed body carries ``timings`` too (mlxcel's
addition, so its draft counters are visible there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mlxcel.server.http.api.responses.request import ResponsesRequest, seal_reasoning, translate
from mlxcel.server.http.chat.output import ChatOutput, ChatParsing, Delta
from mlxcel.server.http.chat.tool_calls import ToolCall
from mlxcel.server.http.formats.base import CompletionStream, ResponseFormat
from mlxcel.server.http.formats.ids import new_id
from mlxcel.server.http.formats.native_result import prompt_progress
from mlxcel.server.http.plan import CompletionPlan, chat_plan
from mlxcel.server.http.prompts import tokenize_text
from mlxcel.server.http.response_store import StoredResponse
from mlxcel.server.http.sse import named_event
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.runtime.task import Partial, Progress, Result


@dataclass
class ResponsesPlan(CompletionPlan):
    request: ResponsesRequest | None = None


def responses_plan(state: ServerState, body: dict, t_arrival: float) -> ResponsesPlan:
    developer_role = "<|channel|>" in (state.template or "")
    chat_body, request = translate(body, state.responses, developer_role=developer_role)
    plan = chat_plan(state, chat_body, t_arrival)
    return ResponsesPlan(**vars(plan), request=request)


class OutputItems:
    """The output items of one response, built from the settled deltas of its text; each method
    returns the events that built what it added (without sequence numbers)."""

    def __init__(self, request: ResponsesRequest):
        self.request = request
        self.items: list[dict] = []
        self.open: dict | None = None  # the reasoning or message item still taking text
        self.text = ""
        self.calls = 0

    def feed(self, delta: Delta) -> list[dict]:
        events: list[dict] = []
        if delta.reasoning:
            self._text("reasoning", delta.reasoning, events)
        if delta.content:
            self._text("message", delta.content, events)
        for call in delta.tool_calls:
            self._call(call, events)
        return events

    def close(self, status: str = "completed") -> list[dict]:
        """The open item done (``incomplete`` when the output was cut short)."""
        item, events = self.open, []
        if item is None:
            return events
        index, text = len(self.items) - 1, self.text
        kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
        part = {"type": kind, "text": text}
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "output_text":
            part = {"type": kind, "annotations": [], "logprobs": [], "text": text}
            events.append({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
        else:
            events.append({"type": "response.reasoning_text.done", **where, "text": text})
            if self.request.include_encrypted:
                item["encrypted_content"] = seal_reasoning(text)
        events.append({"type": "response.content_part.done", **where, "part": dict(part)})
        item["content"] = [part]
        item["status"] = status
        events.append({"type": "response.output_item.done", "output_index": index, "item": _copy(item)})
        self.open, self.text = None, ""
        return events

    def _add(self, item: dict, events: list[dict]) -> int:
        self.items.append(item)
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": _copy(item)})
        return len(self.items) - 1

    def _text(self, kind: str, text: str, events: list[dict]) -> None:
        if self.open is None or self.open["type"] != kind:
            events += self.close()
            if kind == "reasoning":
                item = {"id": new_id("rs_"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = {"id": new_id("msg_"), "type": "message", "status": "in_progress", "role": "assistant",
                        "content": []}
                part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            index = self._add(item, events)
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": part})
            self.open = item
        self.text += text
        where = {"item_id": self.open["id"], "output_index": len(self.items) - 1, "content_index": 0}
        if kind == "reasoning":
            events.append({"type": "response.reasoning_text.delta", **where, "delta": text})
        else:
            events.append({"type": "response.output_text.delta", **where, "delta": text, "logprobs": []})

    def _call(self, call: ToolCall, events: list[dict]) -> None:
        events += self.close()
        limit = self.request.max_tool_calls
        if limit is not None and self.calls >= limit:
            return  # max_tool_calls: the rest are dropped
        self.calls += 1
        item = {"id": "fc_" + call.id, "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": "call_" + call.id, "name": call.name}
        index = self._add(item, events)
        events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": index,
                       "delta": call.arguments})
        events.append({"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index,
                       "arguments": call.arguments})
        item["arguments"], item["status"] = call.arguments, "completed"
        events.append({"type": "response.output_item.done", "output_index": index, "item": _copy(item)})

    def reply(self) -> dict:
        """The output as one assistant chat message (what a follow-up's template renders)."""
        message: dict = {"role": "assistant", "content": ""}
        for item in self.items:
            if item["type"] == "reasoning":
                message["reasoning_content"] = message.get("reasoning_content", "") + item["content"][0]["text"]
            elif item["type"] == "message":
                message["content"] += item["content"][0]["text"]
            else:
                message.setdefault("tool_calls", []).append({
                    "id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}})
        return message


def _copy(item: dict) -> dict:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in item.items()}


def _incomplete(result: Result) -> bool:
    return result.stop_type == "limit"


def _usage(state: ServerState, result: Result, items: OutputItems) -> dict:
    reasoning = "".join(i["content"][0]["text"] for i in items.items if i["type"] == "reasoning")
    n_reasoning = len(tokenize_text(state.loaded.tokenizer, reasoning, add_special=False)) if reasoning else 0
    return {"input_tokens": result.n_prompt, "input_tokens_details": {"cached_tokens": result.timings.cache_n},
            "output_tokens": result.n_predicted, "output_tokens_details": {"reasoning_tokens": n_reasoning},
            "total_tokens": result.n_prompt + result.n_predicted}


def response_object(state: ServerState, plan: ResponsesPlan, created_at: int, *, status: str,
                    output: list[dict] | None = None, usage: dict | None = None, error: dict | None = None) -> dict:
    """A ``response`` object: the request's settings echoed around ``output``."""
    req = plan.request
    sampler = plan.options.sampler
    done = status not in ("queued", "in_progress")
    return {
        "id": req.id, "object": "response", "created_at": created_at, "status": status,
        "background": req.background, "completed_at": int(time.time()) if status == "completed" else None,
        "error": error, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls, "metadata": req.metadata, "model": state.model_name,
        "output": list(output or []), "parallel_tool_calls": bool(plan.chat.parallel) if plan.chat else True,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": req.reasoning_effort, "summary": None}, "service_tier": "default",
        "store": req.store, "temperature": sampler.temperature, "text": req.text, "tool_choice": req.tool_choice,
        "tools": req.tools, "top_logprobs": 0, "top_p": sampler.top_p, "truncation": "disabled",
        "usage": usage if done else None, "user": req.user,
    }


def _record(state: ServerState, plan: ResponsesPlan, response: dict, reply: dict | None) -> None:
    """Keep a finished response (``store``); a background one only while its entry is still there."""
    req = plan.request
    if not req.store or (req.background and req.id not in state.responses):
        return
    state.responses.put(req.id, StoredResponse(response, req.conversation, reply))


def finished_response(state: ServerState, plan: ResponsesPlan, result: Result, created_at: int) -> dict:
    """The whole response of a finished task, stored when the request asks (the non-streamed body)."""
    out = ChatOutput(plan.chat or ChatParsing())
    items = OutputItems(plan.request)
    items.feed(out.feed(result.content))
    items.feed(out.finish())
    status = "incomplete" if _incomplete(result) else "completed"
    items.close(status)
    response = response_object(state, plan, created_at, status=status, output=items.items,
                               usage=_usage(state, result, items))
    _record(state, plan, response, items.reply())
    return response


def failed_response(state: ServerState, plan: ResponsesPlan, created_at: int, error: ApiError,
                    output: list[dict] | None = None) -> dict:
    response = response_object(state, plan, created_at, status="failed", output=output,
                               error={"code": error.type, "message": error.message})
    _record(state, plan, response, None)
    return response


class ResponsesFormat(ResponseFormat):
    def plan(self, state: ServerState, body: dict, t_arrival: float) -> ResponsesPlan:
        return responses_plan(state, body, t_arrival)

    def body(self, state: ServerState, plan: CompletionPlan, results: list[Result], indices: list[int]) -> dict:
        response = finished_response(state, plan, results[0], int(time.time()))
        response["timings"] = results[0].timings.to_json()
        return response

    def stream(self, state: ServerState, plan: CompletionPlan, indices: list[int]) -> CompletionStream:
        return ResponsesStream(state, plan)


class ResponsesStream(CompletionStream):
    """The ``response.*`` events of one response (see the module doc)."""

    def __init__(self, state: ServerState, plan: ResponsesPlan):
        self.state = state
        self.plan = plan
        self.created_at = int(time.time())
        self.sequence = 0
        self.output = ChatOutput(plan.chat or ChatParsing())
        self.items = OutputItems(plan.request)

    def frame(self, chunk: dict) -> bytes:
        return named_event(chunk["type"], chunk)

    def _numbered(self, events: list[dict], **last) -> list[dict]:
        for ev in events:
            ev["sequence_number"] = self.sequence
            self.sequence += 1
        if events and last:
            events[-1].update({k: v for k, v in last.items() if v is not None})
        return events

    def _lifecycle(self, kind: str, status: str, **fields) -> dict:
        response = fields.pop("response", None) or response_object(self.state, self.plan, self.created_at,
                                                                    status=status, output=self.items.items)
        return {"type": kind, "response": response, **fields}

    def opening(self) -> list[dict]:
        return self._numbered([self._lifecycle("response.created", "in_progress"),
                               self._lifecycle("response.in_progress", "in_progress")])

    def progress(self, index: int, progress: Progress) -> list[dict]:
        event = self._lifecycle("response.in_progress", "in_progress")
        return self._numbered([event], timings=progress.timings.to_json() if progress.timings else None,
                              prompt_progress=prompt_progress(progress))

    def partial(self, index: int, partial: Partial) -> list[dict]:
        if not partial.text:
            return []
        events = self.items.feed(self.output.feed(partial.text))
        return self._numbered(events, timings=partial.timings.to_json() if partial.timings else None)

    def final(self, index: int, result: Result) -> list[dict]:
        events = self.items.feed(self.output.finish())
        status = "incomplete" if _incomplete(result) else "completed"
        events += self.items.close(status)
        response = response_object(self.state, self.plan, self.created_at, status=status, output=self.items.items,
                                   usage=_usage(self.state, result, self.items))
        _record(self.state, self.plan, response, self.items.reply())
        events.append({"type": f"response.{status}", "response": response})
        return self._numbered(events, timings=result.timings.to_json())

    def failed(self, error: ApiError) -> list[dict]:
        response = failed_response(self.state, self.plan, self.created_at, error, self.items.items)
        return self._numbered([{"type": "error", "code": error.type, "message": error.message, "param": None},
                               {"type": "response.failed", "response": response}])
