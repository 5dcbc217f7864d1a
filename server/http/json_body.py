"""The one decoder of JSON request bodies: every route that reads a JSON body (the completion
routes, Responses, Messages, tokenize, embeddings, rerank, slots, ``/tools``, the router's proxy
routes...) decodes it here, so every route refuses the same malformed input with the same 400.

Beyond what ``json`` checks, a body must be text a tokenizer, a template and a grammar can take:

- strict UTF-8 (a leading byte order mark is skipped, as upstream's parser does). ``json.loads``
  on bytes would decode with ``surrogatepass``, letting a UTF-16 surrogate encoded as UTF-8
  (``ED A0 80``: CESU-8 / WTF-8) through as a lone surrogate that no tokenizer accepts;
- no lone surrogate written as an escape (``"\\ud800"``): valid JSON syntax, but no character;
- no ``NaN`` / ``Infinity`` literals and no number that overflows a double;
- containers at most :data:`~mlxcel.server.http.limits.MAX_JSON_DEPTH` levels deep. Past the
  interpreter's recursion limit the decoder raises ``RecursionError`` (caught here); below it the
  depth is measured without recursion. The bound is low (64) because what reads a body after this
  (templates, the JSON-schema grammar compiler, pydantic) recurses a few frames per level.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mlxcel.server.http.limits import MAX_JSON_DEPTH
from mlxcel.server.runtime.errors import ApiError, invalid, json_type_name

_BOM = b"\xef\xbb\xbf"
# A \uD800-\uDFFF escape: JSON text may pair them, but Python's decoder also lets a lone one
# through, and a lone surrogate is no character: no tokenizer, template or grammar can take it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_TOO_DEEP = f"parse error: the JSON nests deeper than {MAX_JSON_DEPTH} levels"


def decode_json(raw: bytes) -> Any:
    """The JSON value of a request body, or a 400 ``invalid_request_error`` saying what is wrong
    with it (see the module doc for what is refused beyond JSON's own syntax)."""
    if not raw.strip():
        raise invalid("parse error at line 1, column 1: attempting to parse an empty input; "
                      "check that your input string or stream contains the expected JSON")
    text = _utf8_text(raw[len(_BOM):] if raw.startswith(_BOM) else raw)
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise invalid(f"parse error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise invalid(_TOO_DEEP) from None
    except ValueError as exc:  # NaN/Infinity, an overflowing float, an integer too long to convert
        raise invalid(f"parse error: {exc}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(value, MAX_JSON_DEPTH):
        raise invalid(_TOO_DEEP)
    if _SURROGATE_ESCAPE.search(raw):
        _check_no_lone_surrogate(value)
    return value


def parse_body(raw: bytes) -> dict:
    """A request body that must be a JSON object (every llama-server route's body is one)."""
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, but is {json_type_name(body)}")
    return body


def _utf8_text(raw: bytes) -> str:
    """``raw`` decoded as strict UTF-8; an ill-formed sequence is a 400 naming where it is."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _ill_formed(raw, exc.start) from None


def _ill_formed(raw: bytes, at: int) -> ApiError:
    line = raw.count(b"\n", 0, at) + 1
    column = at - (raw.rfind(b"\n", 0, at) + 1) + 1
    if raw[at] == 0xED and at + 1 < len(raw) and 0xA0 <= raw[at + 1] <= 0xBF:
        what = (f"the bytes {raw[at:at + 3].hex(' ')} encode a UTF-16 surrogate, which is not a character "
                "(CESU-8 / WTF-8 is not UTF-8; a character beyond U+FFFF takes one 4-byte sequence)")
    else:
        what = f"the byte 0x{raw[at]:02x} does not belong there"
    return invalid(f"parse error at line {line}, column {column}: invalid string: ill-formed UTF-8 byte: {what}")


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
        if not isinstance(value, (dict, list)):
            continue
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


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
