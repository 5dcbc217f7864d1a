"""Error bodies with llama-server's shape: ``{"error": {"code", "message", "type"}}``.

Every error a request can provoke is an :class:`ApiError`; the app turns it into this body with
the matching status. Types and statuses follow upstream's (see the ``err_*`` captures).
"""

from __future__ import annotations

from typing import Any

# error type -> HTTP status, as llama-server pairs them
ERROR_STATUS = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}


class ApiError(Exception):
    """A request failed; ``extra`` fields are appended to the error object."""

    def __init__(self, message: str, type: str = "invalid_request_error", *, status: int | None = None,
                 **extra: Any):
        super().__init__(message)
        self.message = message
        self.type = type
        self.status = ERROR_STATUS[type] if status is None else status
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}


def invalid(message: str) -> ApiError:
    return ApiError(message, "invalid_request_error")


def not_supported(message: str) -> ApiError:
    return ApiError(message, "not_supported_error")


def unavailable(message: str) -> ApiError:
    return ApiError(message, "unavailable_error")


def context_exceeded(n_prompt: int, n_ctx: int) -> ApiError:
    return ApiError(
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
        "exceed_context_size_error",
        n_prompt_tokens=n_prompt,
        n_ctx=n_ctx,
    )


def payload_too_large(size: int | None, limit: int) -> ApiError:
    """413 for a body over ``--max-body-size`` (upstream's HTTP library answers 413 too; the body
    here has the usual error shape)."""
    told = f"{size} bytes" if size is not None else "more bytes than that"
    return ApiError(f"the request body is too large: {told}; this server accepts at most {limit} bytes "
                    "(--max-body-size)", "invalid_request_error", status=413)


def body_timeout(seconds: float) -> ApiError:
    return ApiError(f"the request body stalled: nothing arrived for {seconds:g} s (--timeout)",
                    "invalid_request_error", status=408)


def timed_out(seconds: float) -> ApiError:
    return unavailable(f"the request ran longer than the server's --timeout ({seconds:g} s) and was stopped")


def shutting_down() -> ApiError:
    return unavailable("the server is shutting down")


def context_exceeded_at_least(n_least: int, n_ctx: int) -> ApiError:
    """Like :func:`context_exceeded` for a prompt refused before it was tokenized: its size is a
    lower bound."""
    return ApiError(
        f"request (at least {n_least} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
        "exceed_context_size_error",
        n_prompt_tokens=n_least,
        n_ctx=n_ctx,
    )


def not_found_body() -> dict:
    """Upstream's 404 body (its keys come in this order for unknown routes)."""
    return {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


def json_type_name(value: Any) -> str:
    """The JSON type of a decoded value, named as upstream's messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
