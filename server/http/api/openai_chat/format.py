"""The OpenAI ``/v1/chat/completions`` format (``chat.completion`` bodies and chunks)."""

from __future__ import annotations

import time

from mlxcel.server.http.chat.output import ChatOutput, ChatParsing, Delta
from mlxcel.server.http.formats.base import CompletionStream, ResponseFormat
from mlxcel.server.http.formats.native_result import native_final, prompt_progress
from mlxcel.server.http.formats.openai import (
    SYSTEM_FINGERPRINT,
    completion_id,
    finish_reason,
    logprobs_json,
    usage,
)
from mlxcel.server.http.formats.probs import probs_json
from mlxcel.server.http.plan import CompletionPlan, chat_plan
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.task import Partial, Progress, Result
from mlxcel.server.runtime.timings import Timings


def chat_finish_reason(result: Result, called: bool) -> str:
    """``tool_calls`` when the output held calls and ended on its own, as upstream."""
    reason = finish_reason(result.stop_type)
    return "tool_calls" if called and reason == "stop" else reason


def chat_message(result: Result, parsing: ChatParsing | None) -> dict:
    """The assistant message of one choice: content, and the reasoning and tool calls read out of it."""
    out = ChatOutput(parsing or ChatParsing())
    out.feed(result.content)
    out.finish()
    message = {"role": "assistant", "content": out.content}
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [c.to_json() for c in out.tool_calls]
    return message


def chat_completion(results: list[Result], *, model: str, id: str, text: TokenText, logprobs: bool,
                    top_n: int | None = None, parsing: ChatParsing | None = None) -> dict:
    choices = []
    for i, r in enumerate(results):
        message = chat_message(r, parsing)
        choice = {"finish_reason": chat_finish_reason(r, "tool_calls" in message), "index": i, "message": message}
        if logprobs:
            choice["logprobs"] = logprobs_json(r, text, top_n)
        choices.append(choice)
    return {
        "choices": choices,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "object": "chat.completion",
        "usage": usage(results),
        "id": id,
        "timings": results[0].timings.to_json(),
    }


def chat_chunk(*, model: str, id: str, created: int, index: int = 0, delta: dict | None = None,
               finish: str | None = None, logprobs: dict | None = None, timings: Timings | None = None,
               usage_of: Result | None = None, empty_choices: bool = False) -> dict:
    if empty_choices:
        choices = []
    else:
        choice = {"finish_reason": finish, "index": index, "delta": delta if delta is not None else {}}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        choices = [choice]
    body = {
        "choices": choices,
        "created": created,
        "id": id,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "object": "chat.completion.chunk",
    }
    if usage_of is not None:
        body["usage"] = usage([usage_of])
    if timings is not None:
        body["timings"] = timings.to_json()
    return body


class ChatFormat(ResponseFormat):
    def plan(self, state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
        return chat_plan(state, body, t_arrival)

    def body(self, state: ServerState, plan: CompletionPlan, results: list[Result], indices: list[int]) -> dict:
        out = chat_completion(results, model=state.model_name, id=completion_id(), text=state.token_text,
                              logprobs=plan.logprobs, top_n=plan.top_n, parsing=plan.chat)
        if plan.verbose:
            verbose = native_final(results[0], plan.options, index=0, model=state.model_name,
                                   prompt_text=plan.rendered or "", text=state.token_text)
            timings = out.pop("timings")
            out["__verbose"] = verbose
            out["timings"] = timings
        return out

    def stream(self, state: ServerState, plan: CompletionPlan, indices: list[int]) -> CompletionStream:
        return ChatStream(state, plan, indices)


class ChatStream(CompletionStream):
    """Chat chunks: a role chunk opens each choice (with ``return_progress``, the prompt progress
    chunks are role chunks and the first opens the choice), content deltas follow, and the chunk
    with ``finish_reason`` carries the timings (or, with ``include_usage``, a final usage chunk)."""

    done_marker = True

    def __init__(self, state: ServerState, plan: CompletionPlan, indices: list[int]):
        self.state = state
        self.plan = plan
        self.indices = indices
        self.id = completion_id()
        self.created = int(time.time())
        self.opened: set[int] = set()
        self.outputs = {i: ChatOutput(plan.chat or ChatParsing()) for i in indices}

    def _chunk(self, **kw) -> dict:
        return chat_chunk(model=self.state.model_name, id=self.id, created=self.created, **kw)

    def _role(self, index: int, progress: Progress | None = None) -> dict:
        self.opened.add(index)
        chunk = self._chunk(index=index, delta={"role": "assistant", "content": None})
        if progress is not None:
            if progress.timings is not None:
                chunk["timings"] = progress.timings.to_json()
            chunk["prompt_progress"] = prompt_progress(progress)
        return chunk

    def _open(self, index: int) -> list[dict]:
        return [] if index in self.opened else [self._role(index)]

    def opening(self) -> list[dict]:
        if self.plan.options.return_progress:
            return []  # each choice opens with its first progress chunk
        return [self._role(i) for i in self.indices]

    def progress(self, index: int, progress: Progress) -> list[dict]:
        return [self._role(index, progress)]

    def _deltas(self, index: int, delta: Delta, logprobs: dict | None = None, timings=None) -> list[dict]:
        """The chunks of one settled delta: reasoning, then content, then each tool call (its id and
        name, then its arguments), as upstream's diffs go out; ``logprobs`` and ``timings`` ride
        the first and the last of them."""
        bodies: list[dict] = []
        if delta.reasoning:
            bodies.append({"reasoning_content": delta.reasoning})
        if delta.content:
            bodies.append({"content": delta.content})
        out = self.outputs[index]
        first_call = len(out.tool_calls) - len(delta.tool_calls)
        for k, call in enumerate(delta.tool_calls):
            i = first_call + k
            bodies.append({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                           "function": {"name": call.name}}]})
            bodies.append({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]})
        chunks = []
        for k, body in enumerate(bodies):
            chunks.append(self._chunk(index=index, delta=body, logprobs=logprobs if k == 0 else None,
                                      timings=timings if k == len(bodies) - 1 else None))
        return chunks

    def partial(self, index: int, partial: Partial) -> list[dict]:
        chunks = self._open(index)
        if partial.text:
            lp = ({"content": probs_json(partial.probs, self.state.token_text, False, self.plan.top_n)}
                  if self.plan.logprobs else None)
            settled = self._deltas(index, self.outputs[index].feed(partial.text), lp, partial.timings)
            if settled and self.plan.options.draft_flags:
                # this piece's tokens ride the chunk that carries text (held-back markup aside, its text)
                carrier = next((c for c in reversed(settled) if "content" in c["choices"][0]["delta"]), settled[-1])
                carrier["mlxcel_draft_flags"] = list(partial.drafted)
            chunks += settled
        return chunks

    def final(self, index: int, result: Result) -> list[dict]:
        usage_chunk = self.plan.include_usage
        chunks = self._open(index)
        out = self.outputs[index]
        chunks += self._deltas(index, out.finish())
        chunks.append(self._chunk(index=index, finish=chat_finish_reason(result, bool(out.tool_calls)),
                                  timings=None if usage_chunk else result.timings))
        if usage_chunk:
            chunks.append(self._chunk(empty_choices=True, usage_of=result, timings=result.timings))
        return chunks
