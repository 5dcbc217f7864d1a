"""The ``generation_settings`` object upstream echoes on native completions, ``/props`` and
``/slots``: a request's sampler and options, field for field as llama-server prints them."""

from __future__ import annotations

import numpy as np

from mlxcel.server.runtime.task import GenerationOptions


def f32(x: float) -> float:
    """A float as upstream prints it: stored in single precision, printed in double."""
    return float(np.float32(x))


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
        "n_keep": opts.n_keep,
        "n_discard": opts.n_discard,
        "ignore_eos": bool(p.ignore_eos),
        "stream": opts.stream,
        "logit_bias": [{"bias": b if b != float("-inf") else None, "token": t}
                       for t, b in opts.echo.get("logit_bias", {}).items()],
        "n_probs": opts.n_probs,
        "min_keep": getattr(p, "min_keep", 0),
        "grammar": opts.grammar.source if opts.grammar is not None else "",
        "grammar_lazy": False,
        "grammar_triggers": [],
        "preserved_tokens": [],
        "chat_format": "Content-only",
        "reasoning_format": opts.reasoning_format,
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
