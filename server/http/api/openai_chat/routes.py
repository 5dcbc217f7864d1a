"""OpenAI Chat Completions' routes: ``/v1/chat/completions`` (and ``/chat/completions``), the one
pipeline in the chat format, and ``/v1/chat/completions/input_tokens`` (and
``/chat/completions/input_tokens``): the number of tokens a chat request's prompt renders to,
counted in a worker thread (rendering and tokenizing a long conversation takes a while)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from starlette.requests import Request

from mlxcel.server.http.api.openai_chat.format import ChatFormat
from mlxcel.server.http.pipeline import completion_route, read_body
from mlxcel.server.http.plan import chat_body_tokens
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.config import ServerConfig


async def chat_input_tokens(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    body = await read_body(request)
    tokens = await asyncio.to_thread(chat_body_tokens, state, body)
    return JsonResponse({"input_tokens": len(tokens), "object": "response.input_tokens"})


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        router.add_api_route(path, chat_input_tokens, methods=["POST"])
    for path in ("/v1/chat/completions", "/chat/completions"):
        router.add_api_route(path, completion_route(ChatFormat()), methods=["POST"])
