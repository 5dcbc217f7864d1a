"""The router's forwarded routes: every per-model route of a single-model server, answered by the
child that runs the model the request names (the body's ``model`` on ``POST``, ``?model=`` on
``GET``), started first when ``--models-autoload`` (or ``?autoload=true``) allows, as upstream's
router chooses."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from mlxcel.server.http.json_body import decode_json
from mlxcel.server.router.models import Models, RouterError
from mlxcel.server.router.proxy import forward
from mlxcel.server.runtime.config import ServerConfig

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


async def body_json(request: Request) -> tuple[bytes, dict]:
    """The raw body (what is proxied) and its JSON object (``{}`` for an empty body or one that
    is not an object). Decoded by the server's one JSON decoder, so a malformed, too deeply
    nested or ill-formed-text body is the same 400 here as on a model's own server."""
    raw = await request.body()
    data = decode_json(raw) if raw.strip() else {}
    return raw, data if isinstance(data, dict) else {}


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


async def proxy_get(request: Request) -> Response:
    models: Models = request.app.state.models
    autoload = _autoload(request, request.app.state.config)
    inst = _resolve(models, request.query_params.get("model", ""), autoload)
    if autoload:
        await models.ensure_ready(inst.name, request.is_disconnected)
    return await forward(request, models, inst, b"", update_last_used=False)


async def proxy_post(request: Request) -> Response:
    models: Models = request.app.state.models
    raw, data = await body_json(request)
    autoload = _autoload(request, request.app.state.config)
    inst = _resolve(models, data.get("model") if isinstance(data.get("model"), str) else "", autoload)
    if autoload:
        await models.ensure_ready(inst.name, request.is_disconnected)
    return await forward(request, models, inst, raw, update_last_used=True)


def add_routes(router: APIRouter) -> None:
    for path in POST_ROUTES:
        router.add_api_route(path, proxy_post, methods=["POST"])
    for path in GET_ROUTES:
        router.add_api_route(path, proxy_get, methods=["GET"])
