"""CORS as llama-server sends it (``--cors-origins``, ``--cors-methods``, ``--cors-headers``,
``--cors-credentials``).

Every response carries ``Access-Control-Allow-Origin``: with the defaults (origins ``*`` and
credentials on) it echoes the request's ``Origin`` (empty when there is none, as upstream's
captures show); with ``localhost`` it echoes only a localhost origin; otherwise it is the
configured list. An ``OPTIONS`` request is a preflight: 200 with an empty body and the allowed
methods, headers and credentials, before any API key check (browsers send none on preflight).
Starlette's ``CORSMiddleware`` answers differently (it omits the header for unlisted origins and
validates preflights), so this small piece is our own.
"""

from __future__ import annotations

from urllib.parse import urlsplit

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _is_localhost(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname or ""
    except ValueError:
        return False
    return host in _LOCAL_HOSTS


class Cors:
    def __init__(self, origins: str = "*", methods: str = "GET, POST, DELETE, OPTIONS", headers: str = "*",
                 credentials: bool = True):
        self.origins = origins
        self.methods = methods.encode("latin-1")
        self.headers = headers.encode("latin-1")
        self.credentials = b"true" if credentials else b"false"
        self._echo = credentials and origins == "*"
        self._fixed = origins.encode("latin-1")

    @classmethod
    def from_config(cls, config) -> Cors:
        # as upstream: the web UI's server tools (or MCP servers) make the default origin localhost
        web_tools = config.tools or config.mcp_servers_config or config.mcp_servers_json
        origins = config.cors_origins or ("localhost" if web_tools else "*")
        return cls(origins, config.cors_methods, config.cors_headers, config.cors_credentials)

    def allow_origin(self, origin: bytes) -> bytes | None:
        """The ``Access-Control-Allow-Origin`` value for a request with this ``Origin`` header."""
        if self._echo:
            return origin
        if self.origins == "localhost":
            return origin if origin and _is_localhost(origin.decode("latin-1")) else None
        return self._fixed

    def wrap_send(self, origin: bytes, send):
        value = self.allow_origin(origin)
        if value is None:
            return send

        async def with_cors(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"access-control-allow-origin", value)]
            await send(message)

        return with_cors

    async def preflight(self, send) -> None:
        """The answer to ``OPTIONS`` (``send`` already adds the allowed origin)."""
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"access-control-allow-credentials", self.credentials),
            (b"access-control-allow-methods", self.methods),
            (b"access-control-allow-headers", self.headers),
            (b"content-type", b"text/html"),
            (b"content-length", b"0"),
        ]})
        await send({"type": "http.response.body", "body": b""})
