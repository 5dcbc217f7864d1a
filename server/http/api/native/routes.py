"""The completion-style routes: each is the one pipeline with its response format."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from mlxcel.server.http.formats.base import ResponseFormat
from mlxcel.server.http.formats.native import InfillFormat, NativeFormat
from mlxcel.server.http.formats.oai_chat import ChatFormat
from mlxcel.server.http.formats.oai_completion import OaiCompletionFormat
from mlxcel.server.http.pipeline import complete

# path -> the format its bodies take
COMPLETION_ROUTES: dict[str, ResponseFormat] = {
    "/completion": NativeFormat(),
    "/completions": NativeFormat(),
    "/v1/completions": OaiCompletionFormat(),
    "/v1/chat/completions": ChatFormat(),
    "/chat/completions": ChatFormat(),
    "/infill": InfillFormat(),
}


def _handler(fmt: ResponseFormat):
    async def handle(request: Request) -> Response:
        return await complete(request, fmt)

    handle.__name__ = f"{type(fmt).__name__.removesuffix('Format').lower()}_completion"
    return handle


def add_routes(router: APIRouter) -> None:
    for path, fmt in COMPLETION_ROUTES.items():
        router.add_api_route(path, _handler(fmt), methods=["POST"])
