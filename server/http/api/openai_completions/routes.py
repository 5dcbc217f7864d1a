"""OpenAI Completions' route: ``/v1/completions``, the one pipeline in the ``text_completion``
format (upstream's ``/completions`` without ``/v1`` is its native route)."""

from __future__ import annotations

from fastapi import APIRouter

from mlxcel.server.http.api.openai_completions.format import OaiCompletionFormat
from mlxcel.server.http.pipeline import completion_route
from mlxcel.server.runtime.config import ServerConfig


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    router.add_api_route("/v1/completions", completion_route(OaiCompletionFormat()), methods=["POST"])
