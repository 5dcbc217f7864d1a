"""The Anthropic Messages API: ``/v1/messages`` (a Messages body translated into a chat request,
run on the one pipeline, answered as content blocks and Anthropic's named SSE events) and
``/v1/messages/count_tokens``; every error in Anthropic's shape."""

from mlxcel.server.http.api.anthropic.routes import add_routes

__all__ = ["add_routes"]
