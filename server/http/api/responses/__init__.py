"""The OpenAI Responses API: a Responses body translated into a chat request (``request``), run
on the one pipeline and answered as output items and named SSE events (``format``); stored
responses (``previous_response_id``, ``GET`` / ``DELETE`` / ``cancel``, ``background`` runs) in
the server's ``response_store``."""

from mlxcel.server.http.api.responses.routes import add_routes

__all__ = ["add_routes"]
