"""Router mode: the server a command line with no model (no ``-m``, no ``--hf-repo``) and a source
of models (``--models-dir``, ``--models-preset``) starts, as upstream's. It loads no model itself: each model runs in a child ``mlxcel-server`` (see
``models.py``) and the router proxies to it, choosing the child by the request's ``model`` (the
body's, or the ``?model=`` query of ``GET`` routes); ``GET /models`` lists every model with its
status, ``POST /models/load`` / ``/models/unload`` start and stop them, ``GET /models/sse`` streams
their events. The router answers ``/health``, its own ``/props``, ``/tools`` and ``/cors-proxy``,
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
import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from mlxcel.server.http import header_names
from mlxcel.server.http.app import add_error_handlers
from mlxcel.server.http.auth import ApiKeys, invalid_key, mark_key_checked
from mlxcel.server.http.cors import Cors
from mlxcel.server.http.formats.openai import SYSTEM_FINGERPRINT
from mlxcel.server.http.json_body import decode_json
from mlxcel.server.http.limits import BodyLimit
from mlxcel.server.http.routes import cors_proxy, tools, unsupported
from mlxcel.server.http.sse import JsonResponse, event, event_stream
from mlxcel.server.router import child_access
from mlxcel.server.router.catalog import CatalogError, load_catalog
from mlxcel.server.router.downloads import add_model
from mlxcel.server.router.models import Models, RouterError
from mlxcel.server.router.options import ROUTER_ONLY, from_argv
from mlxcel.server.router.proxy import forward
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.tools.registry import ServerTools

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request is too many

# upstream's router proxies these to the child named by the body's "model"
POST_ROUTES = ("/props", "/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
               "/v1/chat/completions/control", "/v1/responses", "/responses", "/v1/audio/transcriptions",
               "/audio/transcriptions", "/v1/messages", "/v1/messages/count_tokens", "/infill", "/embedding",
               "/embeddings", "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking",
               "/v1/systemone", "/tokenize", "/detokenize", "/apply-template", "/chat/completions/input_tokens",
               "/v1/chat/completions/input_tokens", "/responses/input_tokens", "/v1/responses/input_tokens",
               "/lora-adapters", "/slots/{id_slot}")
# ... and these to the child named by ?model=
GET_ROUTES = ("/metrics", "/lora-adapters", "/slots")


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
        warning = cors_proxy.startup_warning(config, bool(self.keys))
        if warning:
            log.warning("%s", warning)

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


def _error(exc: RouterError) -> JsonResponse:
    return JsonResponse({"error": {"code": exc.status, "message": str(exc), "type": exc.type}}, status_code=exc.status)


def _autoload(request: Request, config: ServerConfig) -> bool:
    value = request.query_params.get("autoload", "")
    return config.models_autoload if not value else value in ("true", "1")


def _resolve(models: Models, name: str, autoload: bool):
    if not name:
        raise RouterError("model name is missing from the request")
    inst = models.find(name)
    if inst is None:
        raise RouterError(f"model '{name}' not found")
    if not autoload and not inst.running:
        raise RouterError("model is not loaded")
    return inst


def _ini(name: str, options: dict[str, str]) -> str:
    hidden = ("host", "port", "alias", "tags", *ROUTER_ONLY, *child_access.SECRET_OPTIONS)
    lines = [f"[{name}]"] + [f"{k} = {v}" for k, v in options.items() if k not in hidden]
    return "\n".join(lines) + "\n\n"


def create_router_app(config: ServerConfig) -> FastAPI:
    try:
        catalog = load_catalog(config.models_dir, config.models_preset)
    except CatalogError as exc:
        raise RouterSetupError(str(exc)) from None
    router_options = from_argv(config.argv)
    models = Models(catalog, router_options, config.models_max, config.models_autoload)
    startup = [e.name for e in catalog.values() if e.load_on_startup]
    if config.models_max > 0 and len(startup) > config.models_max:
        raise RouterSetupError(f"number of models to load on startup ({len(startup)}) exceeds models_max "
                               f"({config.models_max})")
    server_tools = ServerTools.from_config(config)

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

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.tools = server_tools
    app.state.models = models
    app.add_middleware(RouterGate, config=config)
    add_error_handlers(app)

    @app.exception_handler(RouterError)
    async def router_error(_req, exc: RouterError):
        return _error(exc)

    router = APIRouter(prefix=config.api_prefix)

    async def health() -> JsonResponse:
        return JsonResponse({"status": "ok"})

    async def props(request: Request) -> Response:
        if request.query_params.get("model"):
            return await proxy_get(request)
        return JsonResponse({
            "role": "router", "max_instances": config.models_max, "models_autoload": config.models_autoload,
            "model_alias": "llama-server", "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0}, "ui_settings": {},
            "build_info": SYSTEM_FINGERPRINT, "cors_proxy_enabled": bool(config.ui_mcp_proxy),
        })

    async def list_models(request: Request) -> JsonResponse:
        if request.query_params.get("reload"):
            await reload()
        data = []
        for inst in models.instances.values():
            if inst.entry.hidden:
                continue
            status = {"value": inst.status, "args": inst.public_args}
            if inst.entry.source == "preset":
                status["preset"] = _ini(inst.name, inst.entry.options)
            if inst.failed:
                status.update(exit_code=inst.exit_code, failed=True)
            info = {"id": inst.name, "aliases": inst.entry.aliases, "tags": inst.entry.tags, "object": "model",
                    "owned_by": "llamacpp", "created": int(time.time()), "status": status,
                    "architecture": (inst.loaded_info.get("architecture") if inst.running else None)
                    or {"input_modalities": ["text"], "output_modalities": ["text"]},
                    "source": inst.entry.source, "can_remove": False}
            if inst.running:
                for key, value in inst.loaded_info.items():
                    info.setdefault(key, value)
            data.append(info)
        return JsonResponse({"data": data, "object": "list"})

    async def reload() -> None:
        try:
            fresh = load_catalog(config.models_dir, config.models_preset)
        except CatalogError as exc:
            raise RouterError(str(exc), 500, "server_error") from None
        await models.reconcile(fresh)

    async def body_json(request: Request) -> tuple[bytes, dict]:
        """The raw body (what is proxied) and its JSON object (``{}`` for an empty body or one that
        is not an object). Decoded by the server's one JSON decoder, so a malformed, too deeply
        nested or ill-formed-text body is the same 400 here as on a model's own server."""
        raw = await request.body()
        data = decode_json(raw) if raw.strip() else {}
        return raw, data if isinstance(data, dict) else {}

    async def load(request: Request) -> JsonResponse:
        _, data = await body_json(request)
        name = data.get("model") if isinstance(data.get("model"), str) else ""
        inst = models.find(name)
        if inst is None:
            raise RouterError("model is not found", 404, "not_found_error")
        if inst.running:
            raise RouterError("model is already running")
        await models.load(inst.name)
        return JsonResponse({"success": True})

    async def unload(request: Request) -> JsonResponse:
        _, data = await body_json(request)
        name = data.get("model") if isinstance(data.get("model"), str) else ""
        inst = models.find(name)
        if inst is None:
            raise RouterError("model is not found")
        if not inst.running:
            raise RouterError("model is not running")
        models.unload(inst.name)
        return JsonResponse({"success": True})

    async def sse(request: Request) -> Response:
        queue = models.subscribe()

        async def events():
            try:
                while not models.stopping:
                    try:
                        message = await asyncio.wait_for(queue.get(), 1.0)
                    except TimeoutError:
                        if await request.is_disconnected():
                            return
                        continue
                    yield event(message)
            finally:
                models.unsubscribe(queue)

        return event_stream(events())

    async def download(request: Request) -> JsonResponse:
        _, data = await body_json(request)
        if not isinstance(data.get("model"), str) or not data["model"]:
            raise RouterError("model must be a non-empty string")
        await add_model(models, data["model"])
        return JsonResponse({"success": True})

    async def remove(request: Request) -> JsonResponse:
        name = request.query_params.get("model", "")
        if not name:
            raise RouterError("model must be a non-empty string")
        if models.find(name) is None:
            raise RouterError(f"model name={name} is not found", 404, "not_found_error")
        raise RouterError(f"model name={name} is not removable (not from cache)")

    async def proxy_get(request: Request) -> Response:
        autoload = _autoload(request, config)
        inst = _resolve(models, request.query_params.get("model", ""), autoload)
        if autoload:
            await models.ensure_ready(inst.name, request.is_disconnected)
        return await forward(request, models, inst, b"", update_last_used=False)

    async def proxy_post(request: Request) -> Response:
        raw, data = await body_json(request)
        autoload = _autoload(request, config)
        inst = _resolve(models, data.get("model") if isinstance(data.get("model"), str) else "", autoload)
        if autoload:
            await models.ensure_ready(inst.name, request.is_disconnected)
        return await forward(request, models, inst, raw, update_last_used=True)

    async def root() -> Response:
        return PlainTextResponse("mlxcel-server (router mode): llama-server compatible API (no web UI)\n")

    for path in ("/health", "/v1/health"):
        router.add_api_route(path, health, methods=["GET"])
    router.add_api_route("/props", props, methods=["GET"])
    for path in ("/models", "/v1/models"):
        router.add_api_route(path, list_models, methods=["GET"])
    router.add_api_route("/models/load", load, methods=["POST"])
    router.add_api_route("/models/unload", unload, methods=["POST"])
    router.add_api_route("/models/sse", sse, methods=["GET"])
    router.add_api_route("/models", download, methods=["POST"])
    router.add_api_route("/models", remove, methods=["DELETE"])
    for path in POST_ROUTES:
        router.add_api_route(path, proxy_post, methods=["POST"])
    for path in GET_ROUTES:
        router.add_api_route(path, proxy_get, methods=["GET"])
    tools.add_routes(router)
    cors_proxy.add_routes(router)
    for path in ("/v1/stream", "/v1/streams/lookup"):
        methods, message = unsupported.NOT_IMPLEMENTED[path]
        router.add_api_route(path, unsupported.not_implemented(message), methods=list(methods))
    router.add_api_route("/", root, methods=["GET"])
    app.router.routes.extend(router.routes)
    return app


class RouterSetupError(Exception):
    """A model source or the startup models cannot be honoured (the router does not start)."""
