"""The OpenAI ``/v1/completions`` format (``text_completion`` bodies and chunks)."""

from __future__ import annotations

import time

from mlxcel.server.http.formats.base import CompletionStream, ResponseFormat
from mlxcel.server.http.formats.native_result import prompt_progress
from mlxcel.server.http.formats.openai import (
    SYSTEM_FINGERPRINT,
    completion_id,
    finish_reason,
    logprobs_json,
    usage,
)
from mlxcel.server.http.formats.probs import probs_json
from mlxcel.server.http.plan import CompletionPlan, oai_completion_plan
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.task import Partial, Progress, Result


def oai_completion(results: list[Result], *, model: str, id: str, text: TokenText, logprobs: bool,
                   top_n: int | None = None, echoed: list[str] | None = None) -> dict:
    """``echoed``: each choice's prompt text, to go before its completion (``echo``)."""
    prefixes = echoed or [""] * len(results)
    return {
        "choices": [{"text": prefix + r.content, "index": i,
                     "logprobs": logprobs_json(r, text, top_n) if logprobs else None,
                     "finish_reason": finish_reason(r.stop_type)} for i, (r, prefix) in enumerate(zip(results, prefixes))],
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "object": "text_completion",
        "usage": usage(results),
        "id": id,
        "timings": results[0].timings.to_json(),
    }


def oai_completion_chunk(*, index: int, content: str, finish: str | None, model: str, id: str,
                         logprobs: dict | None = None, result: Result | None = None) -> dict:
    body = {
        "choices": [{"text": content, "index": index, "logprobs": logprobs, "finish_reason": finish}],
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "object": "text_completion",
    }
    if result is not None:
        body["usage"] = usage([result])
    body["id"] = id
    if result is not None:
        body["timings"] = result.timings.to_json()
    return body


def prompt_text(state: ServerState, plan: CompletionPlan, index: int) -> str:
    """Task ``index``'s prompt as text (what ``echo`` puts before the completion)."""
    return state.loaded.tokenizer.decode(plan.prompt_of(index))


class OaiCompletionFormat(ResponseFormat):
    def plan(self, state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
        return oai_completion_plan(state, body, t_arrival)

    def body(self, state: ServerState, plan: CompletionPlan, results: list[Result], indices: list[int]) -> dict:
        echoed = [prompt_text(state, plan, i) for i in indices] if plan.echo else None
        return oai_completion(results, model=state.model_name, id=completion_id(), text=state.token_text,
                              logprobs=plan.logprobs, echoed=echoed)

    def stream(self, state: ServerState, plan: CompletionPlan, indices: list[int]) -> CompletionStream:
        return OaiCompletionStream(state, plan, indices)


class OaiCompletionStream(CompletionStream):
    done_marker = True

    def __init__(self, state: ServerState, plan: CompletionPlan, indices: list[int]):
        self.state = state
        self.plan = plan
        self.indices = indices
        self.id = completion_id()

    def opening(self) -> list[dict]:
        if not self.plan.echo:
            return []
        return [oai_completion_chunk(index=i, content=prompt_text(self.state, self.plan, i), finish=None,
                                     model=self.state.model_name, id=self.id) for i in self.indices]

    def partial(self, index: int, partial: Partial) -> list[dict]:
        lp = {"content": probs_json(partial.probs, self.state.token_text, False)} if self.plan.logprobs else None
        chunk = oai_completion_chunk(index=index, content=partial.text, finish=None, model=self.state.model_name,
                                     id=self.id, logprobs=lp)
        if self.plan.options.draft_flags:
            chunk["mlxcel_draft_flags"] = list(partial.drafted)
        return [chunk]

    def progress(self, index: int, progress: Progress) -> list[dict]:
        chunk = oai_completion_chunk(index=index, content="", finish=None, model=self.state.model_name, id=self.id)
        if progress.timings is not None:
            chunk["timings"] = progress.timings.to_json()
        chunk["prompt_progress"] = prompt_progress(progress)
        return [chunk]

    def final(self, index: int, result: Result) -> list[dict]:
        return [oai_completion_chunk(index=index, content="", finish=finish_reason(result.stop_type),
                                     model=self.state.model_name, id=self.id, result=result)]
