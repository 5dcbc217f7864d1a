"""The native API's route table: the tokenizer and template routes, and the completion routes,
each the one pipeline in the native format (``/infill`` planning its fill-in-the-middle prompt)."""

from __future__ import annotations

from fastapi import APIRouter

from mlxcel.server.http.api.native.format import InfillFormat, NativeFormat
from mlxcel.server.http.api.native.tokens import apply_template, detokenize, tokenize
from mlxcel.server.http.pipeline import completion_route
from mlxcel.server.runtime.config import ServerConfig


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    router.add_api_route("/tokenize", tokenize, methods=["POST"])
    router.add_api_route("/detokenize", detokenize, methods=["POST"])
    router.add_api_route("/apply-template", apply_template, methods=["POST"])
    for path in ("/completion", "/completions"):  # upstream answers both in its own format
        router.add_api_route(path, completion_route(NativeFormat()), methods=["POST"])
    router.add_api_route("/infill", completion_route(InfillFormat()), methods=["POST"])
