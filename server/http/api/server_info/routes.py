"""Routes that describe the server: health, ``/props``, ``/models``, ``/slots``, ``/metrics``,
the LoRA adapters (``lora_adapters``) and the OpenAPI document."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from mlxcel.server.http import model_info
from mlxcel.server.http.api.server_info.lora_adapters import get_lora_adapters, post_lora_adapters
from mlxcel.server.http.api.server_info.openapi import document
from mlxcel.server.http.pipeline import read_body
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import not_supported


async def health() -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _asleep(state: ServerState):
    """The ``--sleep-idle-seconds`` controller while the model is unloaded, else None."""
    return state.sleep if state.sleep is not None and state.sleep.sleeping else None


async def get_props(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    asleep = _asleep(state)
    return JsonResponse(asleep.props if asleep else model_info.props(state))


async def post_props(request: Request) -> JsonResponse:
    if not request.app.state.server.config.props:
        raise not_supported("This server does not support changing global properties. Start it with `--props`")
    await read_body(request)
    return JsonResponse({"success": True})


async def get_models(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    asleep = _asleep(state)
    return JsonResponse(asleep.models if asleep else model_info.models(state))


async def get_slots(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    if not state.config.slots:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    default = state.default_options()
    return JsonResponse([model_info.slot_json(s, default, state.scheduler.speculation is not None)
                         for s in state.scheduler.slots])


async def metrics(request: Request) -> PlainTextResponse:
    state: ServerState = request.app.state.server
    if not state.config.metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
    asleep = _asleep(state)
    if asleep:
        text = asleep.metrics_text(lambda snapshot: snapshot.render(0, 0))
    else:
        text = state.metrics.render(state.scheduler.processing, state.scheduler.deferred)
        state.metrics.reset_buckets()  # the throughput gauges cover the time between two scrapes
    return PlainTextResponse(text, headers={"Content-Type": "text/plain; version=0.0.4",
                                            "Process-Start-Time-Unix": str(state.metrics.t_start)})


async def openapi_document() -> JsonResponse:
    return JsonResponse(document())


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    for path in ("/health", "/v1/health"):
        router.add_api_route(path, health, methods=["GET"])
    router.add_api_route("/props", get_props, methods=["GET"])
    router.add_api_route("/props", post_props, methods=["POST"])
    for path in ("/models", "/v1/models"):
        router.add_api_route(path, get_models, methods=["GET"])
    router.add_api_route("/slots", get_slots, methods=["GET"])
    router.add_api_route("/metrics", metrics, methods=["GET"])
    router.add_api_route("/lora-adapters", get_lora_adapters, methods=["GET"])
    router.add_api_route("/lora-adapters", post_lora_adapters, methods=["POST"])
    router.add_api_route("/openapi.json", openapi_document, methods=["GET"])
