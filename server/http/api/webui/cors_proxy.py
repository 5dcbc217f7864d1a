"""``GET`` / ``POST /cors-proxy?url=...``: the web UI's CORS proxy for remote MCP servers, behind
``--ui-mcp-proxy`` (off: 403 ``feature_disabled``), as upstream forwards.

The request goes to ``url`` (http or https, no credentials in it, redirects followed, 600 s
timeouts) with the request body as is and *only* the headers the client names explicitly:
``x-llama-server-proxy-header-<name>: value`` becomes ``<name>: value`` (never the client's own
``Authorization``, ``Cookie``, API key...; ``Accept-Encoding``, ``Transfer-Encoding`` and
``Content-Length`` are not forwarded, ``Host`` is the target's). The answer streams back with the
target's status and headers, less hop-by-hop ones and the target's ``Access-Control-*`` (this
server's CORS headers apply).

Without an API key the proxy would let any web page the user opens read any URL this machine can
reach (its localhost services included): so a server with no key serves only requests that cannot
come from another site's page (``same_origin``; 403 ``permission_error`` otherwise), and says so
when it starts (``startup_warning``, logged as the route is added). With a key, the key is the
check, as upstream.

Differences: a bad ``url`` (no host, a port outside 1-65535, a malformed IPv6 address...) is a 400
``invalid_request_error`` (upstream: 500) and a target that cannot be reached a 502 error body
(upstream: 500 with a plain-text "proxy error: ..."), with upstream's messages; the keyless
same-origin rule is mlxcel's.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from mlxcel.server.http.api.webui.disabled import feature_disabled
from mlxcel.server.http.api.webui.same_origin import cross_origin_reason, server_names
from mlxcel.server.http.gate.auth import key_checked
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import ApiError, invalid

log = logging.getLogger(__name__)

PREFIX = "x-llama-server-proxy-header-"
NOT_FORWARDED = {"accept-encoding", "transfer-encoding", "content-length", "host"}
# content-encoding too: the body is passed on decoded
STRIPPED = {"server", "transfer-encoding", "content-length", "keep-alive", "connection", "content-encoding"}
TIMEOUT_S = 600.0


def startup_warning(config, has_keys: bool) -> str | None:
    """The line a server logs at start when the proxy is on without an API key."""
    if not config.ui_mcp_proxy or has_keys:
        return None
    return ("--ui-mcp-proxy without an API key: /cors-proxy serves only same-origin requests to this "
            "server's own address (other web pages get 403); set --api-key to use it from elsewhere")


def target(url: str) -> httpx.URL:
    """``url`` checked as upstream checks it (upstream's messages), every malformed URL a 400."""
    if "://" not in url:
        raise invalid("invalid URL: no scheme")
    scheme = url.split("://", 1)[0]
    if scheme not in ("http", "https"):
        raise invalid(f"unsupported URL scheme: {scheme}")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is no number
        raise invalid(f"invalid target URL: {exc}") from None
    if not host:
        raise invalid("invalid target URL: missing host")
    if port is not None and not 1 <= port <= 65535:
        raise invalid(f"invalid target URL: port {port} is out of range 1-65535")
    if parts.password:
        raise invalid("authentication in target URL is not supported")
    netloc = parts.netloc.rsplit("@", 1)[-1]  # a bare user name is dropped, as upstream never sends it
    try:  # a request built here already (its Host header too), so that nothing later finds the URL bad
        return httpx.Request("GET", parts._replace(netloc=netloc, path=parts.path or "/").geturl()).url
    except (httpx.InvalidURL, ValueError) as exc:  # ValueError: a name IDNA cannot encode
        raise invalid(f"invalid target URL: {exc}") from None


def refuse_other_sites(request: Request) -> None:
    """Without a key, a 403 for a request another site's page may have sent (``same_origin``)."""
    if key_checked(request):
        return
    reason = cross_origin_reason(request.headers, server_names(request.app.state.config.host))
    if reason is not None:
        log.warning("refused /cors-proxy request: %s", reason)
        raise ApiError(f"the CORS proxy of a server without an API key serves only same-origin requests: {reason}",
                       "permission_error")


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
    refuse_other_sites(request)
    url = target(request.query_params.get("url", ""))
    log.info("proxying %s request to %s", request.method, url)
    client = httpx.AsyncClient(follow_redirects=True, timeout=TIMEOUT_S)
    try:
        upstream = await client.send(client.build_request(request.method, url, headers=forwarded_headers(request),
                                                          content=await request.body()), stream=True)
    except (httpx.HTTPError, httpx.InvalidURL, ValueError, OverflowError) as exc:  # a redirect may name a bad URL
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


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    """The route, and the start-up warning when the proxy is on without an API key (the keys are
    read only for a server with the proxy on)."""
    warning = startup_warning(config, bool(config.api_keys())) if config.ui_mcp_proxy else None
    if warning:
        log.warning("%s", warning)
    router.add_api_route("/cors-proxy", proxy, methods=["GET", "POST"])
