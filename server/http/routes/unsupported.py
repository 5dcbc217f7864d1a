"""Routes of features this server does not have, answered as upstream answers when the feature is
switched off (501 ``not_supported_error``)."""

from __future__ import annotations

from fastapi import APIRouter

from mlxcel.server.runtime.errors import not_supported

# path -> (what upstream calls the feature, the flag that enables it there)
DISABLED = {
    "/embedding": ("embeddings", "--embeddings"),
    "/embeddings": ("embeddings", "--embeddings"),
    "/v1/embeddings": ("embeddings", "--embeddings"),
    "/rerank": ("reranking", "--reranking"),
    "/reranking": ("reranking", "--reranking"),
    "/v1/rerank": ("reranking", "--reranking"),
    "/v1/reranking": ("reranking", "--reranking"),
}


def _disabled(what: str, flag: str):
    async def disabled():
        raise not_supported(f"This server does not support {what}. Start it with `{flag}`")

    return disabled


async def slot_action(id_slot: str):
    raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")


async def infill():
    raise not_supported("Infill is not supported by mlxcel-server")


def add_routes(router: APIRouter) -> None:
    router.add_api_route("/slots/{id_slot}", slot_action, methods=["POST"])
    for path, (what, flag) in DISABLED.items():
        router.add_api_route(path, _disabled(what, flag), methods=["POST"])
    router.add_api_route("/infill", infill, methods=["POST"])
