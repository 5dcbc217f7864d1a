"""``GET`` / ``POST /cors-proxy?url=...``: the web UI's CORS proxy for remote MCP servers, behind
``--ui-mcp-proxy`` (off: 403 ``feature_disabled``), as upstream forwards.

The request goes to ``url`` (http or https, no credentials in it, redirects followed, 600 s
timeouts) with the request body as is and *only* the headers the client names explicitly:
``x-llama-server-proxy-header-<name>: value`` becomes ``<name>: value`` (never the client's own
``Authorization``, ``Cookie``, API key...; ``Accept-Encoding``, ``Transfer-Encoding`` and
``Content-Length`` are not forwarded, ``Host`` is the target's). The answer streams back with the
target's status and headers, less hop-by-hop ones and the target's ``Access-Control-*`` (this
server's CORS headers apply).

Differences: a bad ``url`` is a 400 ``invalid_request_error`` (upstream: 500) and a target that
cannot be reached a 502 error body (upstream: 500 with a plain-text "proxy error: ..."), with
upstream's messages.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from mlxcel.server.http.routes.unsupported import feature_disabled
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.runtime.errors import ApiError, invalid

log = logging.getLogger(__name__)

PREFIX = "x-llama-server-proxy-header-"
NOT_FORWARDED = {"accept-encoding", "transfer-encoding", "content-length", "host"}
# content-encoding too: the body is passed on decoded
STRIPPED = {"server", "transfer-encoding", "content-length", "keep-alive", "connection", "content-encoding"}
TIMEOUT_S = 600.0


def target(url: str) -> str:
    """``url`` checked as upstream checks it (upstream's messages)."""
    if "://" not in url:
        raise invalid("invalid URL: no scheme")
    scheme = url.split("://", 1)[0]
    if scheme not in ("http", "https"):
        raise invalid(f"unsupported URL scheme: {scheme}")
    parts = urlsplit(url)
    if not parts.hostname:
        raise invalid("invalid target URL: missing host")
    if parts.password:
        raise invalid("authentication in target URL is not supported")
    netloc = parts.netloc.rsplit("@", 1)[-1]  # a bare user name is dropped, as upstream never sends it
    return parts._replace(netloc=netloc, path=parts.path or "/").geturl()


def forwarded_headers(request: Request) -> dict[str, str]:
    out = {}
    for key, value in request.headers.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):]
        if name and name not in NOT_FORWARDED:
            out[name] = value
    return out


async def proxy(request: Request) -> Response:
    if not request.app.state.config.ui_mcp_proxy:
        return await feature_disabled()
    url = target(request.query_params.get("url", ""))
    log.info("proxying %s request to %s", request.method, url)
    client = httpx.AsyncClient(follow_redirects=True, timeout=TIMEOUT_S)
    try:
        upstream = await client.send(client.build_request(request.method, url, headers=forwarded_headers(request),
                                                          content=await request.body()), stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        error = ApiError(f"proxy error: {exc or type(exc).__name__}", "server_error", status=502)
        return JsonResponse(error.body(), status_code=502)
    headers = {k: v for k, v in upstream.headers.items()
               if k.lower() not in STRIPPED and not k.lower().startswith("access-control-")}

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    if upstream.status_code in (204, 304) or request.method == "HEAD":
        await close()
        return Response(status_code=upstream.status_code, headers=headers)
    return StreamingResponse(upstream.aiter_bytes(), status_code=upstream.status_code, headers=headers,
                             background=BackgroundTask(close))


def add_routes(router: APIRouter) -> None:
    router.add_api_route("/cors-proxy", proxy, methods=["GET", "POST"])
