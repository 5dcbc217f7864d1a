"""The web UI's route table: its server tools (``/tools``), its CORS proxy for remote MCP servers
(``/cors-proxy``), then the page itself, last, so that a ``--path`` catch-all hides no other route
(the app adds this package after every other API)."""

from __future__ import annotations

from fastapi import APIRouter

from mlxcel.server.http.api.webui import cors_proxy, page, tools
from mlxcel.server.runtime.config import ServerConfig


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    tools.add_routes(router, config)
    cors_proxy.add_routes(router, config)
    page.add_routes(router, config)
