"""Request bodies of the completion routes, as pydantic models, and the mapping of validation
failures to upstream's error messages.

Unknown fields are ignored, as llama-server ignores them. Types are checked strictly (a string
where a number belongs is a 400, not a coercion), with upstream's wording:
``Field 'n_predict': type must be number, but is string``.
"""

from __future__ import annotations

from functools import lru_cache
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from mlxcel.server.http.json_body import parse_body  # noqa: F401  (its old home: routes import it from here)
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
    prediction: dict | None = None  # OpenAI's predicted output: {"type": "content", "content": text or text parts}
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
    reasoning_effort: str | None = None
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
    if "number" in kinds and isinstance(value, (int, float)) and not isinstance(value, bool):
        # a number where a number belongs, that the field cannot take: a fraction where an integer
        # belongs, or an integer too large for a double where a float does
        what = "must be an integer" if isinstance(value, float) else "is out of range"
        return invalid(f"Field '{field}': the number {_shown(value)} {what}")
    if kinds:
        expected = " or ".join(kinds)
        return invalid(f"Field '{field}': type must be {expected}, but is {json_type_name(value)}")
    return invalid(f"Field '{field}': {err['msg']}")


def check_range(field: str, value: int | float | None, low: int | float, high: int | float) -> None:
    """Upstream's range check message for a number field."""
    if value is not None and not (low <= value <= high):
        raise invalid(f"Field '{field}': Value must be between {low} <= value <= {high}, but got {_shown(value)}")


def _shown(value: int | float) -> str:
    text = str(value)
    if len(text) > 24:  # 1e308 sent where an integer belongs is a 309-digit integer
        text = f"{text[:12]}... ({len(text.lstrip('-'))} digits)"
    return text


INT_MIN = -INT_MAX - 1
FLT_MAX = 3.4028234663852886e38  # the largest float32
# integer fields upstream reads into a C type wider than int32 (the seed is a uint32 there, which
# a negative value or a larger one wraps into)
_WIDE_INTS = {"seed": (-(2**63), 2**64 - 1), "t_max_predict_ms": (-(2**63), 2**63 - 1),
              "t_max_prompt_ms": (-(2**63), 2**63 - 1)}


def _admits(annotation: Any, kind: type) -> bool:
    """Whether a field's annotation admits ``kind`` (``Int | None`` admits int)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _admits(args[0], kind)
    if origin in (Union, UnionType):
        return any(_admits(a, kind) for a in args)
    return annotation is kind


@lru_cache(maxsize=None)
def _number_fields(model_cls: type[BaseModel]) -> tuple[tuple[str, str, type], ...]:
    """``(attribute, JSON name, int or float)`` of each number field of a request model."""
    out = []
    for name, info in model_cls.model_fields.items():
        kind = int if _admits(info.annotation, int) else float if _admits(info.annotation, float) else None
        if kind is not None:
            out.append((name, info.alias or name, kind))
    return tuple(out)


def check_number_fields(req: BaseModel) -> None:
    """Every number field of a validated request within the C type upstream reads it into (int32
    for an integer unless ``_WIDE_INTS`` says otherwise; float32 for a float, which is also what
    the sampler computes in), whether or not a narrower check of its own comes first. JSON numbers
    have no size: without this a field no range check names (``min_keep``, ``dry_base``, or one
    added later) takes ``2**64`` or ``1e308`` to an MLX array, a C++ extension or a float power,
    which fail on it (``std::bad_cast``, ``OverflowError``) with a 500 instead of the request's 400."""
    for name, json_name, kind in _number_fields(type(req)):
        value = getattr(req, name)
        if value is None or isinstance(value, bool):
            continue
        if kind is int:
            low, high = _WIDE_INTS.get(json_name, (INT_MIN, INT_MAX))
            check_range(json_name, value, low, high)
        elif not -FLT_MAX <= value <= FLT_MAX:
            raise invalid(f"Field '{json_name}': {value:g} is out of range: a 32-bit float holds at most "
                          f"\u00b1{FLT_MAX:.8g}")
