"""Routes of upstream features this server does not have, answered as upstream answers when the
feature is switched off: 501 ``not_supported_error``, with what is missing."""

from __future__ import annotations

from fastapi import APIRouter

from mlxcel.server.runtime.config import ServerConfig
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


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    for path, (methods, message) in NOT_IMPLEMENTED.items():
        router.add_api_route(path, not_implemented(message), methods=list(methods))
