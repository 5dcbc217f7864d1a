"""The web UI: the chat page (or ``--path``'s files), and the two routes it calls besides the
completion APIs: ``/tools`` (server tools, ``--tools`` / MCP servers) and ``/cors-proxy``
(``--ui-mcp-proxy``), each 403 ``feature_disabled`` unless its flag enables it."""

from mlxcel.server.http.api.webui.routes import add_routes

__all__ = ["add_routes"]
