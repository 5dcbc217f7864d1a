"""What ``GET /`` serves: the web chat page shipped in the package (``server/http/webui/index.html``,
package data of ``mlxcel.server.http``), or with ``--path DIR`` that directory's files instead
(``index.html`` for a directory), or nothing with ``--no-ui`` (404, as upstream).

The page is one static file, no build step and nothing fetched from elsewhere; its Content
Security Policy keeps it that way (only this server is reachable from it)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response

from mlxcel.server.runtime.config import ServerConfig

PAGE = resources.files("mlxcel.server.http") / "webui" / "index.html"
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")


async def chat_page() -> Response:
    return Response(PAGE.read_bytes(), media_type="text/html; charset=utf-8",
                    headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP,
                             "X-Content-Type-Options": "nosniff"})


def static_files(root: Path):
    """A GET handler serving the files under ``root`` (nothing outside it, symlinks included)."""
    root = root.resolve()

    async def serve(path: str = "") -> FileResponse:
        target = (root / path).resolve()
        if target != root and root not in target.parents:
            raise HTTPException(404)
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            raise HTTPException(404)
        return FileResponse(target)

    return serve


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    """Registered after every API route, so a catch-all ``--path`` never hides one."""
    if config.static_path:
        router.add_api_route("/{path:path}", static_files(Path(config.static_path)), methods=["GET"])
    elif config.ui:
        for path in ("/", "/index.html"):
            router.add_api_route(path, chat_page, methods=["GET"])
