"""The checks every request passes before a route sees it (a pure ASGI middleware)."""

from __future__ import annotations

import logging

from mlxcel.server.http.gate import header_names
from mlxcel.server.http.gate.auth import ApiKeys, invalid_key, mark_key_checked
from mlxcel.server.http.gate.cors import Cors
from mlxcel.server.http.limits import BodyLimit
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import unavailable

log = logging.getLogger(__name__)


class GateMiddleware:
    """The checks every request passes before a route sees it, in upstream's order: CORS headers
    (and the ``OPTIONS`` preflight), 503 while the model loads, 401 without a valid API key, 413
    for a body over ``--max-body-size`` and 408 for one that stalls past ``--timeout``. Pure ASGI,
    so streaming and disconnect detection are untouched; the cost is a header scan and a couple of
    closures per request (``scripts/bench_gate.py``). A request let in on a valid key is marked so
    (``auth.mark_key_checked``)."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state
        self.cors = Cors.from_config(state.config)
        self.keys = ApiKeys(state.api_keys)
        self.body_limit = BodyLimit(state.config.max_body_size, read_timeout=float(state.config.timeout))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = self.state
        origin = b""
        for name, value in scope.get("headers", ()):
            if name == b"origin":
                origin = value
                break
        send = self.cors.wrap_send(origin, header_names.wrap_send(send))
        if scope.get("method") == "OPTIONS":
            return await self.cors.preflight(send)
        sleep = state.sleep
        if not state.ready and not (sleep is not None and sleep.sleeping):
            message = "Loading model" if state.load_error is None else f"Model failed to load: {state.load_error}"
            return await JsonResponse(unavailable(message).body(), status_code=503)(scope, receive, send)
        path = scope.get("path", "")
        prefix = state.config.api_prefix
        if prefix and path.startswith(prefix):
            path = path[len(prefix):] or "/"
        if self.keys.needed(path):
            if not self.keys.valid(scope.get("headers", ())):
                log.warning("unauthorized request to %s: invalid API key", path)
                return await JsonResponse(invalid_key().body(), status_code=401)(scope, receive, send)
            mark_key_checked(scope)
        size = self.body_limit.declared_too_large(scope)
        if size is not None:
            return await self.body_limit.refuse(size, scope, receive, send)
        if sleep is not None:  # --sleep-idle-seconds: wake the model for a request that needs it
            return await sleep.serve(self.app, scope, self.body_limit.wrap(receive), send)
        return await self.app(scope, self.body_limit.wrap(receive), send)
