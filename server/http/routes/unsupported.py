"""Routes of features this server does not have, answered as upstream answers when the feature is
switched off (501 ``not_supported_error``; 403 ``feature_disabled`` for server tools and the MCP
proxy)."""

from __future__ import annotations

from fastapi import APIRouter

from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.runtime.errors import not_supported

# path -> what the feature is. Upstream's 501 advises a flag that enables it; mlxcel has no such
# flag (its --embeddings / --reranking are refused), so the message says it is not implemented.
DISABLED = {
    "/embedding": "embeddings", "/embeddings": "embeddings", "/v1/embeddings": "embeddings",
    "/rerank": "reranking", "/reranking": "reranking", "/v1/rerank": "reranking", "/v1/reranking": "reranking",
}


def _disabled(what: str):
    async def disabled():
        raise not_supported(f"This server does not support {what}: mlxcel-server does not implement them yet")

    return disabled


# upstream routes mlxcel does not implement (yet): (methods, what the 501 says)
NOT_IMPLEMENTED = {
    "/v1/messages": (("POST",), "the Anthropic Messages API is not implemented in mlxcel-server yet"),
    "/v1/messages/count_tokens": (("POST",), "the Anthropic Messages API is not implemented in mlxcel-server yet"),
    "/v1/responses": (("POST",), "the OpenAI Responses API is not implemented in mlxcel-server yet"),
    "/responses": (("POST",), "the OpenAI Responses API is not implemented in mlxcel-server yet"),
    "/v1/responses/input_tokens": (("POST",), "the OpenAI Responses API is not implemented in mlxcel-server yet"),
    "/responses/input_tokens": (("POST",), "the OpenAI Responses API is not implemented in mlxcel-server yet"),
    "/v1/chat/completions/control": (("POST",), "mlxcel-server has no control channel into a running completion"),
    "/v1/audio/transcriptions": (("POST",), "mlxcel-server serves text models only: there is no audio input"),
    "/audio/transcriptions": (("POST",), "mlxcel-server serves text models only: there is no audio input"),
    "/v1/systemone": (("POST",), "llama-server's SystemOne task API is not implemented in mlxcel-server"),
    "/v1/stream": (("GET", "DELETE"), "resumable streams are not implemented in mlxcel-server"),
    "/v1/streams/lookup": (("POST",), "resumable streams are not implemented in mlxcel-server"),
}


def not_implemented(message: str):
    async def refuse():
        raise not_supported(message)

    return refuse


async def feature_disabled() -> JsonResponse:
    """Upstream's answer on ``/tools`` and ``/cors-proxy`` when server tools and the MCP proxy are
    off (mlxcel has neither): 403 with its own short body."""
    return JsonResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
                        status_code=403)


async def slot_action(id_slot: str):
    raise not_supported("This server does not support slots action: mlxcel-server cannot save, restore or erase "
                        "slots yet (--slot-save-path is ignored)")


async def infill():
    raise not_supported("Infill is not supported by mlxcel-server")


def add_routes(router: APIRouter) -> None:
    router.add_api_route("/slots/{id_slot}", slot_action, methods=["POST"])
    for path, what in DISABLED.items():
        router.add_api_route(path, _disabled(what), methods=["POST"])
    router.add_api_route("/infill", infill, methods=["POST"])
    for path, (methods, message) in NOT_IMPLEMENTED.items():
        router.add_api_route(path, not_implemented(message), methods=list(methods))
