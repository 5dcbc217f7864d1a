"""The routes that describe the server: health, ``/props``, ``/models``, ``/slots``,
``/metrics``, the LoRA adapters and the OpenAPI document of the whole API."""

from mlxcel.server.http.api.server_info.routes import add_routes

__all__ = ["add_routes"]
