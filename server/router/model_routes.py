"""The router's model routes: ``GET /models`` (every model with its status; ``?reload=1`` reads the
sources again), ``POST /models/load`` and ``/models/unload`` (start and stop a model's child),
``GET /models/sse`` (their status events), ``POST /models`` (add a model by its Hugging Face
repository and download it) and ``DELETE /models`` (refused: no model here is removable)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from mlxcel.server.http.sse import JsonResponse, event, event_stream
from mlxcel.server.router import child_access
from mlxcel.server.router.catalog import CatalogError, load_catalog
from mlxcel.server.router.downloads import add_model
from mlxcel.server.router.models import Instance, Models, RouterError
from mlxcel.server.router.options import ROUTER_ONLY
from mlxcel.server.router.proxy_routes import body_json
from mlxcel.server.runtime.config import ServerConfig


def _ini(name: str, options: dict[str, str]) -> str:
    hidden = ("host", "port", "alias", "tags", *ROUTER_ONLY, *child_access.SECRET_OPTIONS)
    lines = [f"[{name}]"] + [f"{k} = {v}" for k, v in options.items() if k not in hidden]
    return "\n".join(lines) + "\n\n"


def _model_json(inst: Instance) -> dict:
    """One model of the list: its status (and, from a preset, its section; a failed start's exit
    code), and what its running child reports about itself."""
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
    return info


async def _reload(config: ServerConfig, models: Models) -> None:
    try:
        fresh = load_catalog(config.models_dir, config.models_preset)
    except CatalogError as exc:
        raise RouterError(str(exc), 500, "server_error") from None
    await models.reconcile(fresh)


async def list_models(request: Request) -> JsonResponse:
    models: Models = request.app.state.models
    if request.query_params.get("reload"):
        await _reload(request.app.state.config, models)
    data = [_model_json(inst) for inst in models.instances.values() if not inst.entry.hidden]
    return JsonResponse({"data": data, "object": "list"})


async def _named(request: Request) -> str:
    _, data = await body_json(request)
    return data.get("model") if isinstance(data.get("model"), str) else ""


async def load(request: Request) -> JsonResponse:
    models: Models = request.app.state.models
    inst = models.find(await _named(request))
    if inst is None:
        raise RouterError("model is not found", 404, "not_found_error")
    if inst.running:
        raise RouterError("model is already running")
    await models.load(inst.name)
    return JsonResponse({"success": True})


async def unload(request: Request) -> JsonResponse:
    models: Models = request.app.state.models
    inst = models.find(await _named(request))
    if inst is None:
        raise RouterError("model is not found")
    if not inst.running:
        raise RouterError("model is not running")
    models.unload(inst.name)
    return JsonResponse({"success": True})


async def sse(request: Request) -> Response:
    models: Models = request.app.state.models
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
    await add_model(request.app.state.models, data["model"])
    return JsonResponse({"success": True})


async def remove(request: Request) -> JsonResponse:
    name = request.query_params.get("model", "")
    if not name:
        raise RouterError("model must be a non-empty string")
    if request.app.state.models.find(name) is None:
        raise RouterError(f"model name={name} is not found", 404, "not_found_error")
    raise RouterError(f"model name={name} is not removable (not from cache)")


def add_routes(router: APIRouter) -> None:
    for path in ("/models", "/v1/models"):
        router.add_api_route(path, list_models, methods=["GET"])
    router.add_api_route("/models/load", load, methods=["POST"])
    router.add_api_route("/models/unload", unload, methods=["POST"])
    router.add_api_route("/models/sse", sse, methods=["GET"])
    router.add_api_route("/models", download, methods=["POST"])
    router.add_api_route("/models", remove, methods=["DELETE"])
