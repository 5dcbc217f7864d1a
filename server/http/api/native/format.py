"""The native ``/completion`` format: llama-server's own body and stream chunks."""

from __future__ import annotations

from typing import Any

from mlxcel.server.http.api.native.infill import infill_plan
from mlxcel.server.http.formats.base import CompletionStream, ResponseFormat
from mlxcel.server.http.formats.native_result import native_final, prompt_progress
from mlxcel.server.http.formats.probs import probs_json
from mlxcel.server.http.plan import CompletionPlan, native_plan
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.task import GenerationOptions, Partial, Progress, Result


def native_partial(partial: Partial, index: int, n_prompt: int, opts: GenerationOptions, text: TokenText) -> dict:
    body = {
        "index": index,
        "content": partial.text,
        "tokens": list(partial.tokens),
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": partial.n_predicted,
        "tokens_evaluated": n_prompt,
    }
    if opts.n_probs > 0:
        body["completion_probabilities"] = probs_json(partial.probs, text, opts.post_sampling_probs)
    if partial.timings is not None:
        body["timings"] = partial.timings.to_json()
    if opts.draft_flags:
        body["mlxcel_draft_flags"] = list(partial.drafted)
    return body


def native_progress(index: int, n_prompt: int, progress: Progress) -> dict:
    body = {
        "index": index, "content": "", "tokens": [0], "stop": False, "id_slot": -1, "tokens_predicted": 0,
        "tokens_evaluated": n_prompt,
    }
    if progress.timings is not None:
        body["timings"] = progress.timings.to_json()
    body["prompt_progress"] = prompt_progress(progress)
    return body


def select_fields(body: dict, fields: list[str]) -> dict:
    """``response_fields``: keep only the named fields; ``a/b`` reaches into nested objects and is
    returned under its full path. Missing fields are left out."""
    out = {}
    for path in fields:
        node: Any = body
        for part in path.split("/"):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            out[path] = node
    return out


def final_body(state: ServerState, plan: CompletionPlan, result: Result, index: int, *, streamed: bool) -> dict:
    """The native body of task ``index`` (a streamed one's last chunk carries no content)."""
    prompt_text = plan.rendered if plan.rendered is not None else state.loaded.tokenizer.decode(plan.prompt_of(index))
    return native_final(result, plan.options, index=index, model=state.model_name, prompt_text=prompt_text,
                        text=state.token_text, content="" if streamed else None)


class NativeFormat(ResponseFormat):
    def plan(self, state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
        return native_plan(state, body, t_arrival)

    def body(self, state: ServerState, plan: CompletionPlan, results: list[Result], indices: list[int]) -> Any:
        bodies = [final_body(state, plan, r, i, streamed=False) for r, i in zip(results, indices)]
        if plan.response_fields:
            bodies = [select_fields(b, plan.response_fields) for b in bodies]
        return bodies[0] if len(bodies) == 1 else bodies

    def stream(self, state: ServerState, plan: CompletionPlan, indices: list[int]) -> CompletionStream:
        return NativeStream(state, plan)


class InfillFormat(NativeFormat):
    """``/infill``: a ``/completion`` whose prompt is the fill-in-the-middle layout (``infill``)."""

    def plan(self, state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
        return infill_plan(state, body, t_arrival)


class NativeStream(CompletionStream):
    def __init__(self, state: ServerState, plan: CompletionPlan):
        self.state = state
        self.plan = plan

    def progress(self, index: int, progress: Progress) -> list[dict]:
        return [native_progress(index, len(self.plan.prompt_of(index)), progress)]

    def partial(self, index: int, partial: Partial) -> list[dict]:
        return [native_partial(partial, index, len(self.plan.prompt_of(index)), self.plan.options,
                               self.state.token_text)]

    def final(self, index: int, result: Result) -> list[dict]:
        return [final_body(self.state, self.plan, result, index, streamed=True)]
