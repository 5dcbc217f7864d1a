"""A validated request -> :class:`GenerationOptions`: server defaults overridden by the request's
fields, upstream's range checks, and explicit refusals of what mlxcel does not implement
(mirostat, top-n-sigma, dynamic temperature, adaptive-p, custom sampler orders). A request's
grammar is read by ``grammar_fields``, its LoRA scales by ``lora_list``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from mlxcel.engine.sampling.grammar import Grammar
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.http.grammar_fields import gbnf_grammar, schema_grammar
from mlxcel.server.http.limits import check_stops
from mlxcel.server.http.lora_list import parse_lora_list
from mlxcel.server.http.prompts import least_tokens, tokenize_text
from mlxcel.server.http.schema import SamplingFields
from mlxcel.server.runtime.config import ArgumentError, ServerConfig
from mlxcel.server.runtime.errors import ApiError, invalid
from mlxcel.server.runtime.task import GenerationOptions

DEFAULT_SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
_SAMPLER_ALIASES = {
    "penalties": "penalties", "dry": "dry", "top_n_sigma": "top_n_sigma", "top-n-sigma": "top_n_sigma",
    "top_k": "top_k", "top-k": "top_k", "typ_p": "typ_p", "typical_p": "typ_p", "typ-p": "typ_p",
    "typical-p": "typ_p", "typical": "typ_p", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p",
    "min_p": "min_p", "min-p": "min_p", "xtc": "xtc", "temperature": "temperature", "temp": "temperature",
}
_SAMPLER_CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                  "m": "min_p", "x": "xtc", "t": "temperature"}
UNSUPPORTED = "is not supported by mlxcel (there is no {what} in its sampler chain)"


# SamplerParams fields that both the command line (build_defaults) and a request set by name
SAMPLER_SCALARS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "xtc_probability", "xtc_threshold",
                   "repeat_last_n", "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier",
                   "dry_base", "dry_allowed_length", "dry_penalty_last_n", "ignore_eos")


@dataclass
class ServerDefaults:
    """What the command line sets for every request."""

    sampler: SamplerParams = field(default_factory=SamplerParams)
    seed: int = -1
    n_predict: int = -1
    samplers: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    cache_prompt: bool = True
    n_keep: int = 0
    n_slots: int = 4
    # upstream's generation_settings["speculative.types"]: "none", or "none,<spec type>" on a drafting server
    speculative_types: str = "none"
    grammar: Grammar | None = None  # --grammar / --grammar-file / -j / -jf: for requests that name none


def _sampler_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(SamplerParams)}


# A stage left out of ``samplers`` runs with the parameter values that make it a no-op.
STAGE_OFF = {
    "penalties": {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
    "dry": {"dry_multiplier": 0.0},
    "top_k": {"top_k": 0},
    "typ_p": {"typical_p": 1.0},
    "top_p": {"top_p": 1.0},
    "min_p": {"min_p": 0.0},
    "xtc": {"xtc_probability": 0.0},
}


def parse_samplers(value: str | list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        names = []
        for ch in value:
            if ch not in _SAMPLER_CHARS:
                raise invalid(f"Field 'samplers': unknown sampler character {ch!r}")
            names.append(_SAMPLER_CHARS[ch])
        return names
    names = []
    for name in value:
        canonical = _SAMPLER_ALIASES.get(name.lower())
        if canonical is None:
            raise invalid(f"Field 'samplers': unknown sampler {name!r}")
        names.append(canonical)
    return names


def apply_sampler_order(params: dict, samplers: list[str]) -> None:
    """Honour a ``samplers`` list that keeps the default order: stages left out are disabled.
    Any other order is refused (the chain's order is fixed)."""
    positions = [DEFAULT_SAMPLERS.index(s) for s in samplers]
    if positions != sorted(positions) or len(set(positions)) != len(positions):
        raise invalid("Field 'samplers': mlxcel's sampler chain has a fixed order (" + ";".join(DEFAULT_SAMPLERS)
                      + "); a custom order is not supported, only leaving stages out")
    present = set(samplers)
    for stage, neutral in STAGE_OFF.items():
        if stage not in present:
            params.update(neutral)
    if "temperature" not in present and params.get("temperature", 1.0) > 0:
        params["temperature"] = 1.0


def build_defaults(config: ServerConfig) -> ServerDefaults:
    """Per-request defaults from the command line (validated like a request would be)."""
    known = _sampler_fields()
    params = {name: getattr(config, name) for name in SAMPLER_SCALARS if name in known}
    if config.dry_sequence_breaker and "dry_sequence_breakers" in known:
        breakers = [] if config.dry_sequence_breaker == ["none"] else config.dry_sequence_breaker
        params["dry_sequence_breakers"] = tuple(breakers)
    bias = parse_logit_bias_flag(config.logit_bias)
    if bias and "logit_bias" in known:
        params["logit_bias"] = bias
    samplers = list(DEFAULT_SAMPLERS)
    spec = config.samplers.split(";") if config.samplers else config.sampler_seq
    if spec:
        samplers = parse_samplers(spec)
        apply_sampler_order(params, samplers)
    if "seed" in known:
        params["seed"] = config.seed
    return ServerDefaults(sampler=SamplerParams(**params), seed=config.seed, n_predict=config.n_predict,
                          samplers=samplers, cache_prompt=config.cache_prompt, n_keep=config.n_keep,
                          n_slots=config.n_slots, grammar=default_grammar(config))


def default_grammar(config: ServerConfig) -> Grammar | None:
    """The command line's grammar (``args`` has read the files and checked the text)."""
    try:
        if config.json_schema is not None:
            return schema_grammar(json.loads(config.json_schema), prefix="-j/--json-schema: ")
        if config.grammar:
            return gbnf_grammar(config.grammar)
    except (ValueError, ApiError) as exc:
        raise ArgumentError(f"the command line's grammar: {getattr(exc, 'message', exc)}") from None
    return None


def parse_logit_bias(value: Any, tokenizer, vocab_size: int) -> dict[int, float]:
    """``[[id, bias]]``, ``[[text, bias]]`` (every token of the text) and OpenAI's ``{"id": bias}``
    (keys may also be text); a bias of ``false`` bans the token."""
    if value is None:
        return {}
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for entry in value:
            if not isinstance(entry, list) or len(entry) != 2:
                raise invalid("Field 'logit_bias': entries must be [token, bias] pairs")
            items.append((entry[0], entry[1]))
    else:
        raise invalid("Field 'logit_bias': must be an array of [token, bias] pairs or an object")
    out: dict[int, float] = {}
    for key, bias in items:
        if bias is False:
            b = -math.inf
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool):
            b = float(bias)
        else:
            raise invalid("Field 'logit_bias': a bias must be a number or false")
        if isinstance(key, bool):
            raise invalid("Field 'logit_bias': a token must be an id or a string")
        if isinstance(key, int):
            ids = [key]
        elif isinstance(key, str):
            digits = key[1:] if key.startswith("-") else key
            ids = [int(key)] if digits.isascii() and digits.isdigit() else tokenize_text(tokenizer, key,
                                                                                         add_special=False)
        else:
            raise invalid("Field 'logit_bias': a token must be an id or a string")
        for t in ids:
            if 0 <= t < vocab_size:
                out[t] = b
    return out


def check_unsupported(req: SamplingFields) -> None:
    if req.mirostat:
        raise invalid("Field 'mirostat': " + UNSUPPORTED.format(what="mirostat sampler"))
    if req.top_n_sigma is not None and req.top_n_sigma > 0:
        raise invalid("Field 'top_n_sigma': " + UNSUPPORTED.format(what="top-n-sigma stage"))
    if req.dynatemp_range is not None and req.dynatemp_range > 0:
        raise invalid("Field 'dynatemp_range': " + UNSUPPORTED.format(what="dynamic temperature"))
    if req.adaptive_target is not None and req.adaptive_target >= 0:
        raise invalid("Field 'adaptive_target': " + UNSUPPORTED.format(what="adaptive-p stage"))
    for name in CHAT_PARSER_FIELDS:
        if getattr(req, name) is not None:
            raise invalid(f"Field '{name}': {CHAT_PARSER_FIELDS[name]}")
    if req.speculative_ngram_min_hits not in (None, 0, 1):
        raise invalid("Field 'speculative.ngram_min_hits': mlxcel's prompt lookup proposes every match (min hits 1)")


# Fields llama-server's chat parser sets for its own tasks: mlxcel reads its output its own way
# (http.chat_output), and honouring them silently would change the output, so they are refused
# unless null. (The reasoning budget fields are honoured: http.reasoning.)
_PARSER = "set by llama-server's chat parser for the tasks it builds; mlxcel has no such parser, so it cannot honour it"
CHAT_PARSER_FIELDS = {
    "chat_format": _PARSER, "chat_parser": _PARSER, "generation_prompt": _PARSER, "parse_tool_calls": _PARSER,
    "preserved_tokens": _PARSER, "grammar_lazy": _PARSER, "grammar_triggers": _PARSER, "reasoning_control": _PARSER,
}


def request_n_predict(n_predict: int | None, server_n_predict: int) -> int:
    """As upstream: a request's own ``n_predict`` wins; absent or -1 it is the server's ``-n``."""
    return server_n_predict if n_predict is None or n_predict == -1 else n_predict


def generation_options(req: SamplingFields, defaults: ServerDefaults, loaded, *, n_predict: int | None,
                       n_probs: int = 0, stream: bool | None = None) -> GenerationOptions:
    """Merge a request over the server defaults (its fields already checked by
    ``plan.check_sampling_fields``). ``n_predict`` is the route's resolved length field
    (``n_predict``/``max_tokens``/``max_completion_tokens``); ``n_probs`` the route's resolved
    probability count."""
    known = _sampler_fields()
    params = {f: getattr(defaults.sampler, f) for f in known}
    for name in (*SAMPLER_SCALARS, "min_keep"):  # min_keep: a request field only
        value = getattr(req, name, None)
        if value is not None and name in known:
            params[name] = value
    # out-of-range probabilities mean "off" at the top end and are clamped, as upstream does
    for name in ("top_p", "min_p", "typical_p", "xtc_probability", "xtc_threshold"):
        if name in params:
            params[name] = min(max(float(params[name]), 0.0), 1.0)
    if req.dry_sequence_breakers is not None and "dry_sequence_breakers" in known:
        params["dry_sequence_breakers"] = tuple(req.dry_sequence_breakers)
    bias = parse_logit_bias(req.logit_bias, loaded.tokenizer, loaded.vocab_size)
    if bias and "logit_bias" in known:
        params["logit_bias"] = {**dict(params.get("logit_bias") or {}), **bias}
    samplers = parse_samplers(req.samplers)
    if samplers is not None:
        apply_sampler_order(params, samplers)
    seed = req.seed if req.seed is not None else defaults.seed
    if "seed" in known:
        params["seed"] = seed
    stop = req.stop
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    check_stops(stops)
    echo = {name: getattr(req, name) for name in ("mirostat_tau", "mirostat_eta", "dynatemp_exponent", "adaptive_decay")
            if getattr(req, name) is not None}
    if params.get("ignore_eos"):  # as upstream shows it: the end-of-generation tokens banned by a -inf bias
        bias = {**bias, **{t: -math.inf for t in sorted(loaded.eos_token_ids) if t not in bias}}
    if bias:
        echo["logit_bias"] = bias
    return GenerationOptions(
        lora=request_lora(req.lora, loaded),
        sampler=SamplerParams(**params),
        seed=seed,
        n_predict=request_n_predict(n_predict, defaults.n_predict),
        stop=[s for s in stops if s],
        n_probs=n_probs,
        post_sampling_probs=bool(req.post_sampling_probs),
        cache_prompt=defaults.cache_prompt if req.cache_prompt is None else req.cache_prompt,
        id_slot=req.id_slot if req.id_slot is not None else -1,
        return_tokens=bool(req.return_tokens),
        return_progress=bool(req.return_progress),
        timings_per_token=bool(req.timings_per_token),
        stream=bool(req.stream) if stream is None else stream,
        samplers=samplers if samplers is not None else list(defaults.samplers),
        n_indent=req.n_indent or 0,
        n_keep=req.n_keep if req.n_keep is not None else defaults.n_keep,
        n_discard=req.n_discard or 0,
        t_max_predict_ms=req.t_max_predict_ms if req.t_max_predict_ms is not None else -1,
        sse_ping_interval=req.sse_ping_interval if req.sse_ping_interval is not None else -1,
        spec_type=req.speculative_type,
        spec_ngram_max=req.speculative_ngram_size_n,
        spec_n_max=(req.speculative_n_max if req.speculative_n_max is not None else req.speculative_ngram_size_m),
        spec_n_min=req.speculative_n_min,
        spec_stochastic=req.speculative_stochastic_accept,
        draft_flags=bool(req.mlxcel_draft_flags),
        speculative_types=defaults.speculative_types,
        echo=echo,
    )


PREDICTION_FORM = ('must be {"type": "content", "content": ...} with the content a string or an array of '
                   '{"type": "text", "text": string} parts')


def prediction_text(value: dict) -> str:
    """OpenAI's ``prediction`` object as its text: ``content`` a string, or text parts joined as they are."""
    kind = value.get("type")
    if kind != "content":
        shown = f"'{kind}'" if isinstance(kind, str) else "missing" if kind is None else json.dumps(kind)[:40]
        raise invalid(f"Field 'prediction': type must be 'content' (the only kind of predicted output), not {shown}")
    content = value.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"Field 'prediction': {PREDICTION_FORM}")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid(f"Field 'prediction': content part {i} is not a text part; {PREDICTION_FORM}")
        texts.append(part["text"])
    return "".join(texts)


def prediction_tokens(value: dict | None, tokenizer, n_ctx: int, piece_chars: int = 0) -> list[int] | None:
    """A request's ``prediction`` as the tokens the model would write it with (no special tokens parsed,
    none added); None without one. A prediction longer than a slot's context could never be written
    out, and is refused before it is tokenized when its length alone says so."""
    if value is None:
        return None
    text = prediction_text(value)
    least = least_tokens(text, piece_chars)
    if least > n_ctx:
        raise invalid(f"Field 'prediction': the prediction is at least {least} tokens, more than the context "
                      f"({n_ctx} tokens)")
    tokens = tokenize_text(tokenizer, text, add_special=False, parse_special=False)
    if len(tokens) > n_ctx:
        raise invalid(f"Field 'prediction': the prediction is {len(tokens)} tokens, more than the context "
                      f"({n_ctx} tokens)")
    return tokens


def request_lora(value: Any, loaded) -> dict[int, float] | None:
    """A request's ``lora`` list as scales by adapter id; None when it lists none (the request then runs
    at the server's global scales, as upstream)."""
    if value is None:
        return None
    adapters = getattr(loaded, "adapters", None)
    return parse_lora_list(value, len(adapters) if adapters is not None else 0, "Field 'lora': ") or None


def parse_logit_bias_flag(entries: list[str] | None) -> dict[int, float]:
    """``-l 15043+1`` / ``-l 15043-1`` / ``-l 15043-inf``."""
    out: dict[int, float] = {}
    for entry in entries or []:
        for i in range(1, len(entry)):
            if entry[i] in "+-":
                try:
                    out[int(entry[:i])] = float(entry[i:])
                except ValueError:
                    break
                break
        else:
            raise ArgumentError(f"--logit-bias {entry!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS")
        if not out:
            raise ArgumentError(f"--logit-bias {entry!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS")
    return out
