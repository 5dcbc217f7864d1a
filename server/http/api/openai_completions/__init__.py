"""The OpenAI (legacy) Completions API: ``text_completion`` bodies and chunks over a raw prompt."""

from mlxcel.server.http.api.openai_completions.routes import add_routes

__all__ = ["add_routes"]
