"""Forwarding one request to a model's server and streaming its answer back, as upstream's router
does: same method, path, query, headers and body; the answer's status, headers (less hop-by-hop
ones and the child's ``Access-Control-*``: the router's CORS applies) and body, streamed as it
comes. A client that hangs up closes the connection to the child, which cancels the request there.
The request counts as the model's until the answer is done, so the model is never evicted
mid-request. The client's own key (``Authorization``, ``X-Api-Key``) is the router's business and
is not passed on: the child gets the router's private credential instead (``child_access``)."""

from __future__ import annotations

import asyncio
import logging

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.router import child_access
from mlxcel.server.router.models import CHILD_HOST, Instance, Models

log = logging.getLogger(__name__)

DROPPED_REQUEST = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "authorization",
                   "x-api-key"}
DROPPED_RESPONSE = {"server", "transfer-encoding", "content-length", "keep-alive", "connection", "date"}

_client: httpx.AsyncClient | None = None


def client() -> httpx.AsyncClient:
    global _client
    if _client is None:  # one pool for every child; no read timeout: a generation takes what it takes
        _client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=64))
    return _client


async def forward(request: Request, models: Models, inst: Instance, body: bytes, update_last_used: bool) -> Response:
    models.begin_request(inst, update_last_used)
    try:
        if models.fake_timing:  # the model counts as busy meanwhile (upstream's test switch)
            await asyncio.sleep(2)
        url = f"http://{CHILD_HOST}:{inst.port}{request.url.path}"
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in DROPPED_REQUEST]
        headers += list(child_access.auth_headers(models.credential).items())
        upstream = await client().send(client().build_request(request.method, url, params=request.query_params,
                                                              headers=headers, content=body), stream=True)
    except httpx.HTTPError as exc:
        models.end_request(inst)
        log.error("proxy to model %s failed: %s", inst.name, exc)
        body = {"error": {"code": 502, "message": f"proxy error: {exc or type(exc).__name__}", "type": "server_error"}}
        return JsonResponse(body, status_code=502)
    except BaseException:
        models.end_request(inst)
        raise
    headers = {k: v for k, v in upstream.headers.items()
               if k.lower() not in DROPPED_RESPONSE and not k.lower().startswith("access-control-")}

    finished = False

    async def done() -> None:  # from the body's end, or after the response if the client left first
        nonlocal finished
        if finished:
            return
        finished = True
        await upstream.aclose()
        models.end_request(inst)

    async def body_chunks():
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await done()

    return StreamingResponse(body_chunks(), status_code=upstream.status_code, headers=headers,
                             background=BackgroundTask(done))
