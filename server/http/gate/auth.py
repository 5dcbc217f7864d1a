"""API keys (``--api-key K1,K2``, ``--api-key-file``): which routes need one and whether a request
carries a valid one.

As upstream: the key comes in ``Authorization``, as ``Bearer <key>`` or bare ``<key>`` (upstream strips
the prefix when present), or, when that header is absent, in the ``X-Api-Key`` header that
Anthropic-style clients send. Only ``/health``, ``/v1/health`` and the web page (``/``,
``/index.html``, upstream's UI assets) are public: everything else, the model list (``/models``,
``/v1/models``, which in router mode also reloads and removes models) included, needs a key, as
llama-server 11434 has it. A missing or wrong key is 401 ``{"error": {"code": 401, "message":
"Invalid API Key", "type": "authentication_error"}}``. Keys are compared in constant time.

A gate that let a request through on a valid key says so in the request's state
(``KEY_CHECKED``), so a route that is only safe for a caller who proved who they are (the web UI's
CORS proxy) can tell a keyed request from a server that has no key at all.
"""

from __future__ import annotations

import hmac

from mlxcel.server.runtime.errors import ApiError

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/", "/index.html"})
KEY_CHECKED = "mlxcel_api_key_checked"  # set in scope["state"] (request.state) by the gates


def mark_key_checked(scope) -> None:
    """Record on the request that it carried a valid API key (read by ``key_checked``)."""
    scope.setdefault("state", {})[KEY_CHECKED] = True


def key_checked(request) -> bool:
    """Whether the gate let ``request`` (a Starlette request) in on a valid API key."""
    return bool(request.scope.get("state", {}).get(KEY_CHECKED))


def invalid_key() -> ApiError:
    return ApiError("Invalid API Key", "authentication_error")


class ApiKeys:
    def __init__(self, keys: list[str]):
        self.keys = [k.encode("utf-8") for k in keys]

    def __bool__(self) -> bool:
        return bool(self.keys)

    def needed(self, path: str) -> bool:
        return bool(self.keys) and path not in PUBLIC_PATHS

    def valid(self, headers) -> bool:
        """``headers``: the ASGI scope's list of (lower-case name, value) byte pairs."""
        found = dict(headers)  # ASGI names are lower case
        given = found.get(b"authorization") or found.get(b"x-api-key")
        if not given:
            return False
        if given[:7].lower() == b"bearer ":
            given = given[7:]
        given = given.strip()
        ok = False
        for key in self.keys:  # no early exit: the time taken does not say which key was near
            ok |= hmac.compare_digest(key, given)
        return ok
