"""Google Cloud Vertex AI's prediction protocol, as upstream serves it when ``AIP_MODE=PREDICTION``
(``cli.args.gcp_environment`` reads the variables into the config).

``POST <AIP_PREDICT_ROUTE>`` takes ``{"instances": [...]}``; each instance names a route in
``@requestFormat`` (a path such as ``/v1/chat/completions`` or its camelCase alias
``chatCompletions``) and is that route's request body. The instances run concurrently through the
app itself, headers and all (so the API key, limits and errors are exactly the route's), never
streamed; the answer is ``{"predictions": [...]}`` with each route's JSON body in order, an error
body included. Written by hand: it is a thin in-process dispatch over routes this app already has.
"""

from __future__ import annotations

import asyncio
import json
import re

from fastapi import FastAPI
from starlette.requests import Request

from mlxcel.server.http.pipeline import read_body
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import ApiError, invalid

MAX_INSTANCES = 128  # upstream's bound


def request_format(path: str) -> str:
    """A route's camelCase alias: ``/v1/chat/completions`` -> ``chatCompletions``,
    ``/apply-template`` -> ``applyTemplate`` (path parameters are cut off)."""
    path = re.sub(r"^/v1(?=/|$)", "", path).lstrip("/").split("{")[0].split(":")[0]
    parts = [p for p in re.split(r"[/_-]", path) if p]
    return "".join(p if i == 0 else p[:1].upper() + p[1:] for i, p in enumerate(parts))


def error_body(message: str, kind: str = "invalid_request_error") -> dict:
    return ApiError(message, kind).body()


async def _call(app, scope: dict, method: str, path: str, body: bytes) -> object:
    """One request through the whole app, in process: the JSON body it answers."""
    headers = [(k, v) for k, v in scope.get("headers", ()) if k not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    inner = {**scope, "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers}
    inner.pop("route", None)
    inner.pop("endpoint", None)
    inner.pop("path_params", None)
    done = asyncio.Event()
    sent = False
    chunks: list[bytes] = []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    try:
        await app(inner, receive, send)
    finally:
        done.set()
    data = b"".join(chunks)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def add_gcp_routes(app: FastAPI, config: ServerConfig) -> None:
    if config.gcp_predict_route is None:
        return
    prefix = config.api_prefix
    predict = config.gcp_predict_route
    methods: dict[str, str] = {}  # route path (no prefix) -> the method to call it with
    for route in app.routes:
        if hasattr(route, "methods") and route.path.startswith(prefix):
            path = route.path[len(prefix):] or "/"
            if path == predict:
                raise ValueError(f"AIP_PREDICT_ROUTE={predict} conflicts with an existing route")
            methods.setdefault(path, "POST" if "POST" in route.methods else sorted(route.methods)[0])
    aliases: dict[str, str] = {}
    for path in methods:
        aliases.setdefault(request_format(path), path)

    async def predict_route(request: Request) -> JsonResponse:
        body = await read_body(request)  # a JSON object, or a 400
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise invalid("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise invalid(f"instances array exceeds maximum size of {MAX_INSTANCES}")

        async def one(instance) -> object:
            if not isinstance(instance, dict):
                return error_body("each instance must be a JSON object")
            fmt = instance.get("@requestFormat")
            if not isinstance(fmt, str):
                return error_body("each instance must include a string @requestFormat")
            path = aliases.get(fmt) or (fmt if fmt in methods else None)
            if path is None or "{" in path:
                return error_body(f"no handler registered for @requestFormat: {fmt}")
            payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
            if "stream" in payload:
                payload["stream"] = False  # the predict route does not stream
            return await _call(request.app, request.scope, methods[path], prefix + path,
                               json.dumps(payload).encode())

        return JsonResponse({"predictions": list(await asyncio.gather(*(one(i) for i in instances)))})

    app.add_api_route(prefix + predict, predict_route, methods=["POST"])
    if config.gcp_health_route:
        health = next(r for r in app.routes if getattr(r, "path", None) == prefix + "/health")
        app.add_api_route(config.gcp_health_route, health.endpoint, methods=["GET"])
