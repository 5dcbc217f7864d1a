"""Response framing: compact UTF-8 JSON bodies and Server-Sent Events, byte for byte as
llama-server sends them (``data: <json>\\n\\n`` per event; ``data: [DONE]`` ends OpenAI-style
streams only; ``Content-Type: text/event-stream`` without a charset). The Responses and Anthropic
streams name each event (``event: <type>`` before its ``data:`` line), as upstream does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response, StreamingResponse

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> bytes:
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a non-finite float (e.g. the log-probability of a banned token)
        text = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def _finite(obj: Any) -> Any:
    """JSON has no infinities: -inf becomes the most negative double, NaN becomes null."""
    if isinstance(obj, float):
        if obj != obj:
            return None
        if obj in (float("inf"), float("-inf")):
            return -1.7976931348623157e308 if obj < 0 else 1.7976931348623157e308
        return obj
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class JsonResponse(Response):
    media_type = JSON_CONTENT_TYPE

    def render(self, content: Any) -> bytes:
        return dumps(content)


def event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def named_event(name: str, obj: Any) -> bytes:
    """An event with an ``event:`` line, as the Responses and Anthropic streams name theirs."""
    return b"event: " + name.encode("utf-8") + b"\ndata: " + dumps(obj) + b"\n\n"


def event_stream(chunks: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(chunks, headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"})
