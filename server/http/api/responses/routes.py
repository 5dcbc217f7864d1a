"""The OpenAI Responses routes: create (``/v1/responses``, ``/responses``), count input tokens,
and a stored response by id (``GET``, ``DELETE``, ``POST .../cancel``).

A request runs on the one completion pipeline in the Responses format. ``background: true``
queues the same tasks and answers at once with the response ``queued``; its result lands in the
store when it finishes (``GET`` polls it, ``cancel`` stops it).
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from mlxcel.server.http.api.responses.format import (
    ResponsesFormat,
    ResponsesPlan,
    failed_response,
    finished_response,
    response_object,
    responses_plan,
)
from mlxcel.server.http.api.responses.request import not_found, translate
from mlxcel.server.http.pipeline import complete, read_body
from mlxcel.server.http.plan import render_chat
from mlxcel.server.http.prompts import tokenize_prompt
from mlxcel.server.http.response_store import StoredResponse
from mlxcel.server.http.schema import ChatRequest, validate
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.tasks import gather_results, open_tasks
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import ApiError, invalid
from mlxcel.server.runtime.scheduler import TaskHandle

log = logging.getLogger(__name__)
FORMAT = ResponsesFormat()


async def create(request: Request) -> Response:
    body = await read_body(request)
    if body.get("background") is not True:
        return await complete(request, FORMAT)
    state: ServerState = request.app.state.server
    plan = await asyncio.to_thread(responses_plan, state, body, time.perf_counter())  # as pipeline.complete
    handles = open_tasks(state, plan)
    created_at = int(time.time())
    entry = StoredResponse(response_object(state, plan, created_at, status="queued"), plan.request.conversation)
    state.responses.put(plan.request.id, entry)
    entry.worker = asyncio.ensure_future(_run_background(state, plan, handles, created_at, entry))
    return JsonResponse(entry.response)


async def _run_background(state: ServerState, plan: ResponsesPlan, handles: list[TaskHandle], created_at: int,
                          entry: StoredResponse) -> None:
    try:
        results = await gather_results(handles)
        finished_response(state, plan, results[0], created_at)
    except asyncio.CancelledError:
        entry.response = {**entry.response, "status": "cancelled"}
        raise
    except ApiError as exc:
        failed_response(state, plan, created_at, exc)
    except Exception as exc:  # the engine's failure is this response's, not the server's
        log.exception("background response %s failed", plan.request.id)
        failed_response(state, plan, created_at, ApiError(f"{type(exc).__name__}: {exc}", "server_error"))
    finally:
        entry.worker = None


async def input_tokens(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    body, _ = translate(await read_body(request), state.responses,
                        developer_role="<|channel|>" in (state.template or ""))
    tokens = tokenize_prompt(state.loaded, render_chat(state, validate(ChatRequest, body), body))
    return JsonResponse({"object": "response.input_tokens", "input_tokens": len(tokens)})


def _stored(request: Request, response_id: str) -> StoredResponse:
    entry = request.app.state.server.responses.get(response_id)
    if entry is None:
        raise not_found(response_id)
    return entry


async def retrieve(request: Request, response_id: str) -> JsonResponse:
    if request.query_params.get("stream", "false").lower() == "true":
        raise invalid("stream=true is not supported: mlxcel-server does not replay a stored response's events")
    return JsonResponse(_stored(request, response_id).response)


async def delete(request: Request, response_id: str) -> JsonResponse:
    _stored(request, response_id)
    request.app.state.server.responses.delete(response_id)
    return JsonResponse({"id": response_id, "object": "response", "deleted": True})


async def cancel(request: Request, response_id: str) -> JsonResponse:
    entry = _stored(request, response_id)
    if not entry.response.get("background"):
        raise invalid("Only responses created with background=true can be cancelled.")
    if entry.worker is not None and not entry.worker.done():
        entry.worker.cancel()
        entry.response = {**entry.response, "status": "cancelled"}
    return JsonResponse(entry.response)


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    for prefix in ("/v1", ""):
        router.add_api_route(f"{prefix}/responses", create, methods=["POST"])
        router.add_api_route(f"{prefix}/responses/input_tokens", input_tokens, methods=["POST"])
        router.add_api_route(f"{prefix}/responses/{{response_id}}", retrieve, methods=["GET"])
        router.add_api_route(f"{prefix}/responses/{{response_id}}", delete, methods=["DELETE"])
        router.add_api_route(f"{prefix}/responses/{{response_id}}/cancel", cancel, methods=["POST"])
