"""llama-server's own result objects that other APIs' bodies embed too: the final body of a task
(a native completion's, and the ``__verbose`` object of an OpenAI chat body with ``verbose``) and
the ``prompt_progress`` object (a native chunk's, and the role chunk of an OpenAI stream or a
Responses event with ``return_progress``). Shared here so no API package reaches into another."""

from __future__ import annotations

from mlxcel.server.http.formats.probs import probs_json
from mlxcel.server.http.formats.settings import generation_settings
from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.task import GenerationOptions, Progress, Result


def prompt_progress(progress: Progress) -> dict:
    """The ``prompt_progress`` object of a native chunk and of a chat role chunk."""
    return {"total": progress.total, "cache": progress.cache, "processed": progress.processed,
            "time_ms": progress.time_ms}


def native_final(result: Result, opts: GenerationOptions, *, index: int, model: str, prompt_text: str,
                 text: TokenText, content: str | None = None) -> dict:
    body = {
        "index": index,
        "content": result.content if content is None else content,
        "tokens": list(result.tokens),
        "id_slot": result.id_slot,
        "stop": True,
        "model": model,
        "tokens_predicted": result.n_predicted,
        "tokens_evaluated": result.n_prompt,
        "generation_settings": generation_settings(opts),
        "prompt": prompt_text,
        "has_new_line": result.has_new_line,
        "truncated": result.truncated,
        "stop_type": result.stop_type,
        "stopping_word": result.stopping_word,
        "tokens_cached": result.tokens_cached,
        "timings": result.timings.to_json(),
    }
    if result.prediction is not None:  # mlxcel: OpenAI's usage counts of a predicted output, under their names
        body["accepted_prediction_tokens"] = result.prediction.accepted
        body["rejected_prediction_tokens"] = result.prediction.rejected
    if opts.n_probs > 0 and content is None:
        body["completion_probabilities"] = probs_json(result.probs, text, opts.post_sampling_probs)
    return body
