"""Reasoning ("thinking") in chat requests: which tags mark it, whether the output is split on
them (``reasoning_format``), whether the generation prompt already opened the block, and the
reasoning budget a request asks for.

The tags are the template's own: the ones it writes around an assistant's ``reasoning_content``
(``template_caps``), else the vocabulary's thinking tokens as mlx-lm finds them
(``TokenizerWrapper.think_start`` / ``think_end``: ``<think>``, ``<longcat_think>``...), for
templates that drop reasoning from the history (DeepSeek R1). ``reasoning_format`` as upstream:
``none`` leaves the thinking in ``content``; ``auto`` (the default), ``deepseek`` and
``deepseek-legacy`` (which this upstream build reads as ``deepseek``) put it in
``reasoning_content``.
"""

from __future__ import annotations

from typing import Any

from mlxcel.server.http.chat.template_caps import TemplateInfo, ThinkMarkers
from mlxcel.server.http.prompts import tokenize_text
from mlxcel.server.runtime.errors import invalid
from mlxcel.server.runtime.reasoning_budget import BudgetSpec

FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def check_format(value: Any, default: str) -> str:
    """A request's ``reasoning_format`` (upstream's message for an unknown one)."""
    if value is None:
        return default
    if not isinstance(value, str) or value not in FORMATS:
        raise invalid(f"Field 'reasoning_format': Unknown reasoning format: {value}")
    return value


def think_markers(info: TemplateInfo, tokenizer) -> ThinkMarkers | None:
    """The thinking tags: the template's, else the vocabulary's."""
    if info.think is not None:
        return info.think
    start, end = getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    if isinstance(start, str) and isinstance(end, str) and start and end:
        return ThinkMarkers(start, end)
    return None


def generation_prompt(with_prompt: str, without: str) -> str:
    """What the generation prompt adds (upstream's definition: the rendering with it, past the
    longest common prefix with the rendering without it)."""
    n = min(len(with_prompt), len(without))
    i = 0
    while i < n and with_prompt[i] == without[i]:
        i += 1
    return with_prompt[i:]


def opens_thinking(text: str, markers: ThinkMarkers) -> bool:
    """Whether ``text`` (the generation prompt, and any continued assistant text) leaves a
    reasoning block open."""
    start = text.rfind(markers.start)
    return start >= 0 and text.rfind(markers.end) < start


def budget_tokens(req, server_budget: int) -> int:
    """``reasoning_budget_tokens`` / ``thinking_budget_tokens``, else ``--reasoning-budget``."""
    for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):
        value = getattr(req, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= 2**31 - 1:
            raise invalid(f"Field '{name}': Value must be an integer between -1 <= value <= 2147483647")
        if value != -1:
            return value
    return server_budget


def _string(req, name: str) -> str | None:
    value = getattr(req, name, None)
    if value is not None and not isinstance(value, str):
        raise invalid(f"Field '{name}': type must be string")
    return value


def budget_spec(req, tokenizer, *, budget: int, markers: ThinkMarkers | None, prefill: str = "",
                message: str | None = None) -> BudgetSpec | None:
    """The budget a request asks for, tokenized, or None (no budget, or no tags to count
    between). The request's ``reasoning_budget_start_tag`` / ``reasoning_budget_end_tags`` (or
    ``reasoning_budget_end_tag``) / ``reasoning_budget_message`` win over the template's tags and
    ``--reasoning-budget-message``, as upstream."""
    start = _string(req, "reasoning_budget_start_tag")
    ends = getattr(req, "reasoning_budget_end_tags", None)
    if ends is not None:
        if not isinstance(ends, list) or not all(isinstance(e, str) for e in ends):
            raise invalid("Field 'reasoning_budget_end_tags': type must be an array of strings")
        ends = [e for e in ends if e]
    else:
        one = _string(req, "reasoning_budget_end_tag")
        ends = [one] if one else None
    if markers is not None:
        start = markers.start if start is None else start
        ends = [markers.end] if ends is None else ends
    message = _string(req, "reasoning_budget_message") if getattr(req, "reasoning_budget_message", None) is not None \
        else message
    if budget < 0 or not start or not ends:
        return None

    def tok(text: str) -> tuple[int, ...]:
        return tuple(tokenize_text(tokenizer, text, add_special=False))

    end_tokens = tuple(tok(e) for e in ends)
    forced = (tok(message) if message else ()) + end_tokens[0]
    return BudgetSpec(tokens=budget, start=tok(start), ends=end_tokens, forced=forced,
                      prefill=tok(prefill) if prefill else ())
