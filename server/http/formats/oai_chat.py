"""The OpenAI ``/v1/chat/completions`` format (``chat.completion`` bodies and chunks)."""

from __future__ import annotations

import time

from mlxcel.server.http.formats.base import CompletionStream, ResponseFormat
from mlxcel.server.http.formats.native import native_final, prompt_progress
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


def chat_completion(results: list[Result], *, model: str, id: str, text: TokenText, logprobs: bool,
                    top_n: int | None = None) -> dict:
    choices = []
    for i, r in enumerate(results):
        choice = {"finish_reason": finish_reason(r.stop_type), "index": i,
                  "message": {"role": "assistant", "content": r.content}}
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
                              logprobs=plan.logprobs, top_n=plan.top_n)
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

    def partial(self, index: int, partial: Partial) -> list[dict]:
        chunks = self._open(index)
        if partial.text:
            lp = ({"content": probs_json(partial.probs, self.state.token_text, False, self.plan.top_n)}
                  if self.plan.logprobs else None)
            chunks.append(self._chunk(index=index, delta={"content": partial.text}, logprobs=lp,
                                      timings=partial.timings))
            if self.plan.options.draft_flags:
                chunks[-1]["mlxcel_draft_flags"] = list(partial.drafted)
        return chunks

    def final(self, index: int, result: Result) -> list[dict]:
        usage_chunk = self.plan.include_usage
        chunks = self._open(index)
        chunks.append(self._chunk(index=index, finish=finish_reason(result.stop_type),
                                  timings=None if usage_chunk else result.timings))
        if usage_chunk:
            chunks.append(self._chunk(empty_choices=True, usage_of=result, timings=result.timings))
        return chunks
