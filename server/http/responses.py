"""Response bodies, native (``/completion``) and OpenAI-style, shaped field for field like
llama-server's (see the captures under ``compat/``): same keys, same order, same value types."""

from __future__ import annotations

import secrets
import string
import time
from typing import Any

import numpy as np

from mlxcel.server.runtime.task import GenerationOptions, Partial, Progress, Result, TokenProb
from mlxcel.server.runtime.timings import Timings
from mlxcel.server.http.token_text import TokenText

SYSTEM_FINGERPRINT = "b0-mlxcel"
_ID_ALPHABET = string.ascii_letters + string.digits


def f32(x: float) -> float:
    """A float as upstream prints it: stored in single precision, printed in double."""
    return float(np.float32(x))


def completion_id() -> str:
    return "chatcmpl-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(32))


def finish_reason(stop_type: str) -> str:
    return "length" if stop_type == "limit" else "stop"


def sampler_settings(opts: GenerationOptions) -> dict:
    """The sampler part of ``generation_settings`` (shared by /props and /slots)."""
    p = opts.sampler
    e = opts.echo
    seed = opts.seed if opts.seed >= 0 else 0xFFFFFFFF
    return {
        "seed": seed,
        "temperature": f32(p.temperature),
        "dynatemp_range": 0.0,
        "dynatemp_exponent": f32(e.get("dynatemp_exponent", 1.0)),
        "top_k": p.top_k,
        "top_p": f32(p.top_p),
        "min_p": f32(p.min_p),
        "top_n_sigma": -1.0,
        "xtc_probability": f32(p.xtc_probability),
        "xtc_threshold": f32(p.xtc_threshold),
        "typical_p": f32(p.typical_p),
        "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": f32(p.repeat_penalty),
        "presence_penalty": f32(p.presence_penalty),
        "frequency_penalty": f32(p.frequency_penalty),
        "dry_multiplier": f32(p.dry_multiplier),
        "dry_base": f32(p.dry_base),
        "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": p.dry_penalty_last_n,
    }


def _tail_settings(opts: GenerationOptions) -> dict:
    e = opts.echo
    return {
        "mirostat": 0,
        "mirostat_tau": f32(e.get("mirostat_tau", 5.0)),
        "mirostat_eta": f32(e.get("mirostat_eta", 0.1)),
        "adaptive_target": -1.0,
        "adaptive_decay": f32(e.get("adaptive_decay", 0.9)),
    }


def generation_settings(opts: GenerationOptions) -> dict:
    """``generation_settings`` of a native completion response."""
    p = opts.sampler
    out = sampler_settings(opts)
    out["dry_sequence_breakers"] = list(getattr(p, "dry_sequence_breakers", ()))
    out.update(_tail_settings(opts))
    out.update({
        "stop": list(opts.stop),
        "max_tokens": opts.n_predict,
        "n_predict": opts.n_predict,
        "n_keep": opts.echo.get("n_keep", 0),
        "n_discard": opts.echo.get("n_discard", 0),
        "ignore_eos": bool(p.ignore_eos),
        "stream": opts.stream,
        "logit_bias": [{"bias": b if b != float("-inf") else None, "token": t}
                       for t, b in opts.echo.get("logit_bias", {}).items()],
        "n_probs": opts.n_probs,
        "min_keep": getattr(p, "min_keep", 0),
        "grammar": "",
        "grammar_lazy": False,
        "grammar_triggers": [],
        "preserved_tokens": [],
        "chat_format": "Content-only",
        "reasoning_format": "none",
        "reasoning_in_content": False,
        "generation_prompt": "",
        "samplers": list(opts.samplers),
        "speculative.types": opts.speculative_types,
        "timings_per_token": opts.timings_per_token,
        "post_sampling_probs": opts.post_sampling_probs,
        "backend_sampling": False,
        "lora": [],
    })
    return out


def slot_params(opts: GenerationOptions) -> dict:
    """The ``params`` of /slots and /props ``default_generation_settings`` (no stop/bias/grammar)."""
    full = generation_settings(opts)
    for key in ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
                "preserved_tokens"):
        full.pop(key, None)
    return full


# -- probabilities ------------------------------------------------------------------------------


def probs_json(probs: list[TokenProb], text: TokenText, post_sampling: bool, top_n: int | None = None) -> list[dict]:
    value_key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def entry(token: int, value: float) -> dict:
        raw = text.token_bytes(token)
        return {"id": token, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), value_key: value}

    out = []
    for p in probs:
        top = p.top if top_n is None else p.top[:top_n]
        item = entry(p.id, p.value)
        item[top_key] = [entry(t, v) for t, v in top]
        out.append(item)
    return out


# -- native -------------------------------------------------------------------------------------


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
    return body


def prompt_progress(progress: Progress) -> dict:
    """The ``prompt_progress`` object of a native chunk and of a chat role chunk."""
    return {"total": progress.total, "cache": progress.cache, "processed": progress.processed,
            "time_ms": progress.time_ms}


def native_progress(index: int, n_prompt: int, progress: Progress) -> dict:
    return {
        "index": index, "content": "", "tokens": [0], "stop": False, "id_slot": -1, "tokens_predicted": 0,
        "tokens_evaluated": n_prompt, "prompt_progress": prompt_progress(progress),
    }


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
        "truncated": False,
        "stop_type": result.stop_type,
        "stopping_word": result.stopping_word,
        "tokens_cached": result.tokens_cached,
        "timings": result.timings.to_json(),
    }
    if opts.n_probs > 0 and content is None:
        body["completion_probabilities"] = probs_json(result.probs, text, opts.post_sampling_probs)
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


# -- OpenAI-style -------------------------------------------------------------------------------


def usage(results: list[Result]) -> dict:
    prompt = results[0].n_prompt if results else 0
    completion = sum(r.n_predicted for r in results)
    cached = results[0].timings.cache_n if results else 0
    return {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _logprobs(result: Result, text: TokenText, top_n: int | None) -> dict:
    return {"content": probs_json(result.probs, text, False, top_n)}


def oai_completion(results: list[Result], *, model: str, id: str, text: TokenText, logprobs: bool,
                   top_n: int | None = None) -> dict:
    return {
        "choices": [{"text": r.content, "index": i,
                     "logprobs": _logprobs(r, text, top_n) if logprobs else None,
                     "finish_reason": finish_reason(r.stop_type)} for i, r in enumerate(results)],
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


def chat_completion(results: list[Result], *, model: str, id: str, text: TokenText, logprobs: bool,
                    top_n: int | None = None) -> dict:
    choices = []
    for i, r in enumerate(results):
        choice = {"finish_reason": finish_reason(r.stop_type), "index": i,
                  "message": {"role": "assistant", "content": r.content}}
        if logprobs:
            choice["logprobs"] = _logprobs(r, text, top_n)
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
