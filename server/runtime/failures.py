"""What a request that failed on the engine thread answers."""

from __future__ import annotations

from mlxcel.engine.sampling.grammar import GrammarError
from mlxcel.server.runtime.errors import ApiError, invalid


def as_api_error(exc: Exception) -> ApiError:
    """An ``ApiError`` as it is; a grammar the engine cannot run, 400 as upstream's sampler
    initialisation answers; anything else, 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, GrammarError):
        return invalid(f"Failed to initialize samplers: {exc}")
    return ApiError(f"generation failed: {type(exc).__name__}: {exc}", "server_error")
