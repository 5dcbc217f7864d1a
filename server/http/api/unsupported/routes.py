"""Routes of features this server does not have, answered as upstream answers when the feature is
switched off (501 ``not_supported_error``; 403 ``feature_disabled`` for server tools and the MCP
proxy)."""

from __future__ import annotations

from fastapi import APIRouter

from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.runtime.errors import not_supported

# upstream routes mlxcel does not implement (yet): (methods, what the 501 says)
NOT_IMPLEMENTED = {
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


def add_routes(router: APIRouter) -> None:
    for path, (methods, message) in NOT_IMPLEMENTED.items():
        router.add_api_route(path, not_implemented(message), methods=list(methods))
