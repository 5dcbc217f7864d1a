"""Router mode: the server a command line with no model (no ``-m``, no ``--hf-repo``) and a source
of models (``--models-dir``, ``--models-preset``) starts, as upstream's. It loads no model itself: each model runs in a child ``mlxcel-server`` (see
``models.py``) and the router proxies to it, choosing the child by the request's ``model`` (the
body's, or the ``?model=`` query of ``GET`` routes: ``proxy_routes.py``); ``GET /models`` lists
every model with its status, ``POST /models/load`` / ``/models/unload`` start and stop them, ``GET
/models/sse`` streams their events (``model_routes.py``). The router answers ``/health``, its own ``/props``, ``/tools`` and ``/cors-proxy``,
checks API keys (on every route but ``/health``, ``/v1/health`` and ``/``) and CORS; its children run
on ``127.0.0.1`` and take requests only with the router's private credential (``child_access``),
which the model list never shows, nor the children's ports.

Why child processes rather than several models in one process: it is upstream's design (so
every per-model route, flag and body comes from a real single-model server, unchanged), a model
that crashes or runs out of memory takes only its own process down, and stopping a process returns
all of its memory to the system, which unloading inside one MLX process does not guarantee.

``POST /models`` adds a model by its Hugging Face repository and downloads it (``downloads.py``).

Differences: a start with neither a model nor a source of models serves mlxcel's built-in model
(upstream routes to its download cache, which mlxcel does not keep); the Hugging Face cache is not
listed (a preset's ``hf-repo`` reaches it, and a model ``POST /models`` added is listed until the
router stops); the errors upstream raises as 500 for a bad request are 400 / 404 here.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from mlxcel.server.http.api.unsupported.routes import NOT_IMPLEMENTED, not_implemented
from mlxcel.server.http.api.webui import cors_proxy, tools
from mlxcel.server.http.app import add_error_handlers
from mlxcel.server.http.formats.openai import SYSTEM_FINGERPRINT
from mlxcel.server.http.gate import header_names
from mlxcel.server.http.gate.auth import ApiKeys, invalid_key, mark_key_checked
from mlxcel.server.http.gate.cors import Cors
from mlxcel.server.http.limits import BodyLimit
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.router import model_routes, proxy_routes
from mlxcel.server.router.catalog import CatalogError, ModelEntry, load_catalog
from mlxcel.server.router.models import Models, RouterError
from mlxcel.server.router.options import from_argv
from mlxcel.server.router.proxy_routes import proxy_get
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.tools.registry import ServerTools

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request is too many


class RouterGate:
    """CORS (and the preflight), API keys and the body limits, as the single-model gate has them:
    every route but ``/health``, ``/v1/health`` and ``/`` needs the key, the model list and its
    reload / removal included."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.cors = Cors.from_config(config)
        self.keys = ApiKeys(config.api_keys())
        self.body_limit = BodyLimit(config.max_body_size, read_timeout=float(config.timeout))
        self.prefix = config.api_prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = next((v for k, v in scope.get("headers", ()) if k == b"origin"), b"")
        send = self.cors.wrap_send(origin, header_names.wrap_send(send))
        if scope.get("method") == "OPTIONS":
            return await self.cors.preflight(send)
        path = scope.get("path", "")
        if self.prefix and path.startswith(self.prefix):
            path = path[len(self.prefix):] or "/"
        if self.keys.needed(path):
            if not self.keys.valid(scope.get("headers", ())):
                return await JsonResponse(invalid_key().body(), status_code=401)(scope, receive, send)
            mark_key_checked(scope)
        size = self.body_limit.declared_too_large(scope)
        if size is not None:
            return await self.body_limit.refuse(size, scope, receive, send)
        return await self.app(scope, self.body_limit.wrap(receive), send)


def create_router_app(config: ServerConfig) -> FastAPI:
    catalog, models = _models(config)
    server_tools = ServerTools.from_config(config)
    app = FastAPI(lifespan=_lifespan(catalog, models, server_tools), docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.tools = server_tools
    app.state.models = models
    app.add_middleware(RouterGate, config=config)
    add_error_handlers(app)
    app.add_exception_handler(RouterError, _router_error)
    router = APIRouter(prefix=config.api_prefix)
    _add_routes(router, config)
    app.router.routes.extend(router.routes)
    return app


def _models(config: ServerConfig) -> tuple[dict[str, ModelEntry], Models]:
    """The catalog the model sources give, and the children that will run its models; the
    startup models checked against ``--models-max`` (a :class:`RouterSetupError` otherwise)."""
    try:
        catalog = load_catalog(config.models_dir, config.models_preset)
    except CatalogError as exc:
        raise RouterSetupError(str(exc)) from None
    models = Models(catalog, from_argv(config.argv), config.models_max, config.models_autoload)
    startup = [e.name for e in catalog.values() if e.load_on_startup]
    if config.models_max > 0 and len(startup) > config.models_max:
        raise RouterSetupError(f"number of models to load on startup ({len(startup)}) exceeds models_max "
                               f"({config.models_max})")
    return catalog, models


def _lifespan(catalog: dict[str, ModelEntry], models: Models, server_tools: ServerTools | None):
    """Start: the server tools, then the startup models (in the background: the router listens
    meanwhile). Stop: every child, then the tools."""

    @asynccontextmanager
    async def lifespan(_app):
        if server_tools is not None:
            await server_tools.start()
        asyncio.get_running_loop().create_task(models.load_startup_models())
        log.info("router mode: %d models (%s); loaded on demand", len(catalog), ", ".join(catalog) or "none")
        yield
        await models.unload_all()
        if server_tools is not None:
            await server_tools.stop()

    return lifespan


async def _router_error(_req, exc: RouterError) -> JsonResponse:
    return JsonResponse({"error": {"code": exc.status, "message": str(exc), "type": exc.type}}, status_code=exc.status)


def _add_routes(router: APIRouter, config: ServerConfig) -> None:
    """The router's own routes (health, its ``/props``), the model routes, the routes forwarded to
    the children, the web UI's tools and CORS proxy, upstream's unimplemented stream routes, and
    the root page."""
    for path in ("/health", "/v1/health"):
        router.add_api_route(path, health, methods=["GET"])
    router.add_api_route("/props", props, methods=["GET"])
    model_routes.add_routes(router)
    proxy_routes.add_routes(router)
    tools.add_routes(router, config)
    cors_proxy.add_routes(router, config)
    for path in ("/v1/stream", "/v1/streams/lookup"):
        methods, message = NOT_IMPLEMENTED[path]
        router.add_api_route(path, not_implemented(message), methods=list(methods))
    router.add_api_route("/", root, methods=["GET"])


async def health() -> JsonResponse:
    return JsonResponse({"status": "ok"})


async def props(request: Request) -> Response:
    """The router's own properties; with ``?model=``, that model's (its child answers)."""
    if request.query_params.get("model"):
        return await proxy_get(request)
    config: ServerConfig = request.app.state.config
    return JsonResponse({
        "role": "router", "max_instances": config.models_max, "models_autoload": config.models_autoload,
        "model_alias": "llama-server", "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0}, "ui_settings": {},
        "build_info": SYSTEM_FINGERPRINT, "cors_proxy_enabled": bool(config.ui_mcp_proxy),
    })


async def root() -> Response:
    return PlainTextResponse("mlxcel-server (router mode): llama-server compatible API (no web UI)\n")


class RouterSetupError(Exception):
    """A model source or the startup models cannot be honoured (the router does not start)."""
