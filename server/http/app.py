"""The FastAPI application: the gate every request passes, the error mapping, and the routes of
every API the server speaks (``APIS``, one package each under ``api/``), over a
:class:`ServerState` the model loads into.

The model loads in a background thread after the server starts listening; until it is ready every
route answers 503 ``unavailable_error`` ("Loading model"), as upstream does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.server.http.api import (
    anthropic,
    embeddings,
    native,
    openai_chat,
    openai_completions,
    responses,
    server_info,
    slot_actions,
    unsupported,
    webui,
)
from mlxcel.server.http.api.gcp import add_gcp_routes
from mlxcel.server.http.gate.middleware import GateMiddleware
from mlxcel.server.http.limits import BodyRefused, Limits
from mlxcel.server.http.sleep import IdleSleep, unload
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.startup import load_into
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import ApiError, invalid, not_found_body
from mlxcel.server.tools.registry import ServerTools

log = logging.getLogger(__name__)

# The APIs the server speaks, one package each (``api/``), added in this order; the web UI last, as
# ``--path`` serves every other GET.
APIS = (server_info, unsupported, native, openai_completions, openai_chat, slot_actions, embeddings, responses,
        anthropic, webui)


def create_app(config: ServerConfig, loader: Callable[[], LoadedModel] | None = None) -> FastAPI:
    """Build the app. ``loader()`` returns a ``LoadedModel``; it runs in a background thread at
    startup (default: the model the config names)."""
    state = ServerState(config=config)
    state.api_keys = config.api_keys()
    state.limits = Limits.from_config(config)

    def load():
        try:
            load_into(state, loader)
        except Exception as exc:
            log.error("model loading failed: %s", exc)
            state.load_error = str(exc)
            if app.state.on_load_error is not None:
                app.state.on_load_error(exc)

    if config.sleep_idle_seconds > 0:
        state.sleep = IdleSleep(state, config.sleep_idle_seconds, reload=lambda: load_into(state, loader),
                                unload=lambda: unload(state))

    server_tools = ServerTools.from_config(config)  # None: /tools answers 403; ToolsSetupError: not started

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=load, name="mlxcel-load", daemon=True).start()
        if state.sleep is not None:
            state.sleep.start()
        if server_tools is not None:
            await server_tools.start()  # MCP servers' tools discovered before the server listens, as upstream
        yield
        if server_tools is not None:
            await server_tools.stop()
        if state.sleep is not None:
            state.sleep.stop()
        if state.scheduler is not None:
            state.scheduler.stop()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.state.config = config
    app.state.tools = server_tools
    app.state.on_load_error = None
    app.add_middleware(GateMiddleware, state=state)
    add_error_handlers(app)
    router = APIRouter(prefix=config.api_prefix)
    for api in APIS:
        api.add_routes(router, config)
    app.router.routes.extend(router.routes)  # flat, so app.routes lists every route
    add_gcp_routes(app, config)  # Vertex AI's prediction route, when AIP_MODE=PREDICTION
    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every failure becomes llama-server's error body with the matching status."""

    @app.exception_handler(ApiError)
    async def api_error(_req, exc: ApiError):
        return JsonResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_req, exc: StarletteHTTPException):
        if exc.status_code in (404, 405):
            return JsonResponse(not_found_body(), status_code=404)
        err = ApiError(str(exc.detail), "invalid_request_error" if exc.status_code < 500 else "server_error")
        return JsonResponse(err.body(), status_code=err.status)

    @app.exception_handler(BodyRefused)
    async def body_refused(_req, exc: BodyRefused):
        return JsonResponse(exc.error.body(), status_code=exc.error.status, headers={"Connection": "close"})

    @app.exception_handler(RequestValidationError)
    async def validation_error(_req, exc):
        return JsonResponse(invalid(str(exc)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(_req, exc: Exception):
        log.exception("unhandled error")
        return JsonResponse(ApiError(f"{type(exc).__name__}: {exc}", "server_error").body(), status_code=500)
