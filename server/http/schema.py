"""Request bodies of the completion routes, as pydantic models, and the mapping of validation
failures to upstream's error messages.

Unknown fields are ignored, as llama-server ignores them. Types are checked strictly (a string
where a number belongs is a 400, not a coercion), with upstream's wording:
``Field 'n_predict': type must be number, but is string``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from mlxcel.server.http.limits import MAX_JSON_DEPTH
from mlxcel.server.runtime.errors import ApiError, invalid, json_type_name

INT_MAX = 2147483647


def _integral(value: Any) -> Any:
    """JSON has one number type: accept 4.0 where an integer belongs (upstream does)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]


class SamplingFields(BaseModel):
    """The fields shared by every completion route (native and OpenAI-style)."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    n_predict: Int | None = None
    max_tokens: Int | None = None
    temperature: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    top_k: Int | None = None
    top_p: float | None = None
    min_p: float | None = None
    top_n_sigma: float | None = None
    typical_p: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    repeat_last_n: Int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: Int | None = None
    dry_penalty_last_n: Int | None = None
    dry_sequence_breakers: list[str] | None = None
    mirostat: Int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    adaptive_target: float | None = None
    adaptive_decay: float | None = None
    logit_bias: Any = None
    ignore_eos: bool | None = None
    seed: Int | None = None
    stop: str | list[str] | None = None
    n_probs: Int | None = None
    min_keep: Int | None = None
    n_keep: Int | None = None
    n_discard: Int | None = None
    post_sampling_probs: bool | None = None
    cache_prompt: bool | None = None
    id_slot: Int | None = None
    return_tokens: bool | None = None
    return_progress: bool | None = None
    response_fields: list[str] | None = None
    timings_per_token: bool | None = None
    stream: bool | None = None
    stream_options: dict | None = None
    samplers: str | list[str] | None = None
    speculative_n_max: Int | None = Field(None, alias="speculative.n_max")
    speculative_n_min: Int | None = Field(None, alias="speculative.n_min")
    speculative_stochastic_accept: bool | None = Field(None, alias="speculative.stochastic_accept")  # mlxcel
    mlxcel_draft_flags: bool | None = None  # mlxcel: per-token accepted-draft flags in stream chunks
    speculative_type: str | None = Field(None, alias="speculative.type")
    speculative_ngram_size_n: Int | None = Field(None, alias="speculative.ngram_size_n")
    speculative_ngram_size_m: Int | None = Field(None, alias="speculative.ngram_size_m")
    speculative_ngram_min_hits: Int | None = Field(None, alias="speculative.ngram_min_hits")
    speculative_p_min: float | None = Field(None, alias="speculative.p_min")
    max_completion_tokens: Int | None = None
    n_indent: Int | None = None
    t_max_predict_ms: Int | None = None
    t_max_prompt_ms: Int | None = None
    n_cache_reuse: Int | None = None
    sse_ping_interval: Int | None = None
    backend_sampling: bool | None = None
    verbose: bool | None = None
    reasoning_format: str | None = None
    # set by upstream's chat parser for its own tasks (and reasoning budgets): refused unless null
    chat_format: Any = None
    chat_parser: Any = None
    generation_prompt: Any = None
    parse_tool_calls: Any = None
    preserved_tokens: Any = None
    grammar_lazy: Any = None
    grammar_triggers: Any = None
    reasoning_control: Any = None
    reasoning_budget_tokens: Any = None
    reasoning_budget_start_tag: Any = None
    reasoning_budget_end_tag: Any = None
    reasoning_budget_end_tags: Any = None
    reasoning_budget_message: Any = None
    thinking_budget_tokens: Any = None
    grammar: str | None = None
    json_schema: Any = None
    response_format: Any = None
    lora: Any = None
    n_cmpl: Int | None = None
    n: Int | None = None
    model: Any = None


class CompletionRequest(SamplingFields):
    """``POST /completion`` and ``/v1/completions``: ``prompt`` is required (checked by the route,
    so a missing prompt gets upstream's own message)."""

    prompt: Any = None
    logprobs: Int | bool | None = None  # OpenAI completions: an integer count; native: n_probs's alias
    echo: bool | None = None  # OpenAI completions: the prompt before the completion


class ChatRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Any = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    reasoning_effort: Any = None
    chat_template_kwargs: dict | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | str | None = None
    tools: list | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    content: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    tokens: list[Int] | None = None


_EXPECTED = {
    "int_type": "number", "int_parsing": "number", "int_from_float": "number", "float_type": "number",
    "float_parsing": "number", "bool_type": "boolean", "bool_parsing": "boolean", "string_type": "string",
    "list_type": "array", "dict_type": "object",
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _too_deep(body: Any, limit: int) -> bool:
    """Whether containers nest deeper than ``limit`` (iterative: a hostile body cannot recurse)."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def parse_body(raw: bytes) -> dict:
    """Decode a JSON object body; malformed JSON is a 400 ``invalid_request_error``. Beyond what
    ``json`` accepts, this refuses the non-standard ``NaN`` / ``Infinity`` literals, numbers that
    overflow a double, and containers nested deeper than ``MAX_JSON_DEPTH``."""
    if not raw.strip():
        raise invalid("parse error at line 1, column 1: attempting to parse an empty input; "
                      "check that your input string or stream contains the expected JSON")
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise invalid(f"parse error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError:
        raise invalid("parse error: the body is not valid UTF-8") from None
    except RecursionError:
        raise invalid(f"parse error: the JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # NaN/Infinity, an overflowing float, an integer too long to convert
        raise invalid(f"parse error: {exc}") from None
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, but is {json_type_name(body)}")
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(body, MAX_JSON_DEPTH):
        raise invalid(f"parse error: the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    if _SURROGATE_ESCAPE.search(raw):
        _check_no_lone_surrogate(body)
    return body


# A \uD800-\uDFFF escape: JSON text may pair them, but Python's decoder also lets a lone one
# through, and a lone surrogate is no character: no tokenizer, template or grammar can take it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_no_lone_surrogate(body: Any) -> None:
    """Refuse a body holding a lone UTF-16 surrogate anywhere (keys included), as upstream's JSON
    parser does (iterative: a hostile body cannot recurse)."""
    stack = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found = _LONE_SURROGATE.search(value)
            if found:
                raise invalid(f"parse error: invalid string: the lone UTF-16 surrogate "
                              f"\\u{ord(found.group()):04x} is not a character (a surrogate must be "
                              "one of a high/low pair)")
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def validate(model_cls: type[BaseModel], body: dict) -> Any:
    """Build ``model_cls`` from a decoded body, turning the first validation failure into an
    upstream-style 400 naming the field."""
    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc, body) from None


def validation_error(exc: ValidationError, body: dict) -> ApiError:
    errors = exc.errors()
    # With a union type pydantic reports one failure per member: prefer the first.
    err = errors[0]
    field = str(err["loc"][0]) if err["loc"] else "body"
    value = body.get(field) if isinstance(body, dict) else None
    kinds = [_EXPECTED.get(e["type"]) for e in errors if e["loc"] and str(e["loc"][0]) == field]
    kinds = [k for k in dict.fromkeys(kinds) if k]
    if len(err["loc"]) > 1 and isinstance(err["loc"][1], int):
        # an element of an array has the wrong type
        element = value[err["loc"][1]] if isinstance(value, list) else None
        expected = _EXPECTED.get(err["type"], "valid")
        return invalid(f"Field '{field}': type must be an array of {expected}s, "
                       f"but element {err['loc'][1]} is {json_type_name(element)}")
    if kinds:
        expected = " or ".join(kinds)
        return invalid(f"Field '{field}': type must be {expected}, but is {json_type_name(value)}")
    return invalid(f"Field '{field}': {err['msg']}")


def check_range(field: str, value: int | float | None, low: int | float, high: int | float) -> None:
    """Upstream's range check message for an integer field."""
    if value is not None and not (low <= value <= high):
        raise invalid(f"Field '{field}': Value must be between {low} <= value <= {high}, but got {value}")
