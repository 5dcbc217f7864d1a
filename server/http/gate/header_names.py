"""Response header names written as upstream writes them: ``Content-Type``,
``Access-Control-Allow-Origin``, ``Process-Start-Time-Unix``.

Starlette lowercases every header name it sends. HTTP says names are case-insensitive, but clients
that copy the headers into a plain dict (upstream's own server tests do) then look up
``Access-Control-Allow-Origin`` and miss it. So the gate rewrites each name once into its
Title-Case form (cached per name), the form llama-server's HTTP library sends.
"""

from __future__ import annotations

_CANONICAL: dict[bytes, bytes] = {}


def canonical(name: bytes) -> bytes:
    """``b"content-type"`` -> ``b"Content-Type"``."""
    out = _CANONICAL.get(name)
    if out is None:
        out = b"-".join(part[:1].upper() + part[1:].lower() for part in name.split(b"-"))
        if len(_CANONICAL) < 1024:  # names come from our own code, but bound it anyway
            _CANONICAL[name] = out
    return out


def wrap_send(send):
    """``send`` with every ``http.response.start``'s header names in canonical case."""

    async def canonical_send(message):
        if message["type"] == "http.response.start":
            message["headers"] = [(canonical(k), v) for k, v in message.get("headers", ())]
        await send(message)

    return canonical_send
