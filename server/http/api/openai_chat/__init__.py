"""The OpenAI Chat Completions API: ``chat.completion`` bodies and ``chat.completion.chunk``
streams, with the reasoning and tool calls read out of the output, and the prompt's token count."""

from mlxcel.server.http.api.openai_chat.routes import add_routes

__all__ = ["add_routes"]
