"""What every OpenAI-style body shares: ids, the fingerprint, finish reasons, usage and logprobs."""

from __future__ import annotations

from mlxcel.server.http.formats.ids import new_id
from mlxcel.server.http.formats.probs import probs_json
from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.task import Result

SYSTEM_FINGERPRINT = "b0-mlxcel"


def completion_id() -> str:
    return new_id("chatcmpl-")


def finish_reason(stop_type: str) -> str:
    return "length" if stop_type == "limit" else "stop"


def usage(results: list[Result]) -> dict:
    prompt = results[0].n_prompt if results else 0
    completion = sum(r.n_predicted for r in results)
    cached = results[0].timings.cache_n if results else 0
    out = {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}}
    counted = [r.prediction for r in results if r.prediction is not None]
    if counted:  # a request with a predicted output: OpenAI's counts of it, summed over the choices
        out["completion_tokens_details"] = {"accepted_prediction_tokens": sum(c.accepted for c in counted),
                                            "rejected_prediction_tokens": sum(c.rejected for c in counted)}
    return out


def logprobs_json(result: Result, text: TokenText, top_n: int | None) -> dict:
    return {"content": probs_json(result.probs, text, False, top_n)}
