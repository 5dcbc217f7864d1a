"""The Anthropic Messages routes: ``/v1/messages`` (the one completion pipeline in the Anthropic
format) and ``/v1/messages/count_tokens``. Their errors take Anthropic's shape. The API key may
come as ``x-api-key``, as Anthropic's clients send it (the gate accepts it on every route, as
upstream)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from mlxcel.server.http.api.anthropic.format import AnthropicFormat, error_body
from mlxcel.server.http.api.anthropic.request import translate
from mlxcel.server.http.limits import BodyRefused
from mlxcel.server.http.pipeline import complete, read_body
from mlxcel.server.http.plan import chat_body_tokens
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import ApiError

log = logging.getLogger(__name__)
FORMAT = AnthropicFormat()


def _anthropic_errors(handler):
    """Every failure of a Messages route in Anthropic's error shape, an unexpected one (a 500)
    included: Anthropic's clients read no other shape."""
    async def handle(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as exc:
            return JsonResponse(error_body(exc), status_code=exc.status)
        except BodyRefused as exc:
            return JsonResponse(error_body(exc.error), status_code=exc.error.status, headers={"Connection": "close"})
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            return JsonResponse(error_body(ApiError(f"{type(exc).__name__}: {exc}", "server_error")), status_code=500)

    handle.__name__ = handler.__name__
    return handle


async def messages(request: Request) -> Response:
    return await complete(request, FORMAT)


async def count_tokens(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    body = translate(await read_body(request), count_only=True)
    tokens = await asyncio.to_thread(chat_body_tokens, state, body)
    return JsonResponse({"input_tokens": len(tokens)})


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    router.add_api_route("/v1/messages", _anthropic_errors(messages), methods=["POST"])
    router.add_api_route("/v1/messages/count_tokens", _anthropic_errors(count_tokens), methods=["POST"])
