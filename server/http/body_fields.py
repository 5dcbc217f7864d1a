"""One field of a request body read before the body is translated into a chat request (the
Responses and Anthropic Messages APIs): its JSON type checked, so a mistyped field is a 400 that
names it and its type, as upstream's JSON accessors answer, instead of a failure further on."""

from __future__ import annotations

from typing import Any

from mlxcel.server.runtime.errors import invalid, json_type_name


def typed(body: dict, name: str, kind: type, what: str) -> Any:
    """``body[name]`` when it is of JSON type ``kind`` (an integral number for ``int``), else a 400."""
    value = body.get(name)
    if value is None:
        return None
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise invalid(f"Field '{name}': type must be {what}, but is {json_type_name(value)}")
    return value
