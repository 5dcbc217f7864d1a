"""``GET /tools`` (the tools and their definitions) and ``POST /tools`` (``{"tool", "params",
"stream"}``: call one), as upstream serves them for its web UI when ``--tools`` or an MCP server
is configured; otherwise both answer 403 ``feature_disabled``, and no request reaches a file or a
process.

Upstream's bodies, which differ from the rest of the API: a call's own failure is a 200 with
``{"error": "..."}``; a request that cannot be made is an error object *not* wrapped in
``"error"``: 400 for a malformed body or a missing or mistyped parameter, 404 for an unknown tool
(or ``stream`` asked of one that cannot), 500 for an unusable runtime. A streamed call answers
``data: {"chunk": ...}`` events and ends with ``data: {"done": true}`` (with ``"error"`` when it
failed); a client that hangs up ends the command.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from mlxcel.server.http.api.webui.disabled import feature_disabled
from mlxcel.server.http.pipeline import read_body
from mlxcel.server.http.sse import JsonResponse, event, event_stream
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.tools.builtin import ToolParamError
from mlxcel.server.tools.io import ToolRuntimeError
from mlxcel.server.tools.registry import McpTool, ServerTools, UnknownTool

log = logging.getLogger(__name__)


def _error(message: str, status: int, type_: str, code: int | None = None) -> JsonResponse:
    return JsonResponse({"code": status if code is None else code, "message": message, "type": type_},
                        status_code=status)


async def get_tools(request: Request) -> Response:
    tools: ServerTools | None = request.app.state.tools
    if tools is None:
        return await feature_disabled()
    return JsonResponse(tools.listing())


async def post_tools(request: Request) -> Response:
    tools: ServerTools | None = request.app.state.tools
    if tools is None:
        return await feature_disabled()
    try:
        body = await read_body(request)  # the one JSON decoder every route uses
    except ApiError as exc:
        return _error(exc.message, exc.status, exc.type)
    try:
        name = body.get("tool")
        if not isinstance(name, str):
            raise ToolParamError("'tool' must be a string")
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise ToolParamError("'params' must be an object")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ToolParamError("'stream' must be a boolean")
        tool = tools.find(name, stream)
        headers = {k: v for k, v in request.headers.items() if k in ("x-tool-cwd", "x-tool-runtime", "x-resp-type")}
        if isinstance(tool, McpTool):
            return JsonResponse(await tool.ainvoke(params))
        params = await asyncio.to_thread(tools.call_params, params, headers)
        if stream:
            return event_stream(_streamed(tool, params))
        return JsonResponse(await asyncio.to_thread(tool.invoke, params, None))
    except (ValueError, ToolParamError) as exc:  # ValueError: a parameter the tool cannot use
        return _error(str(exc), 400, "invalid_request_error")
    except UnknownTool as exc:
        return _error(str(exc), 404, "invalid_request_error", code=400)
    except ToolRuntimeError as exc:
        log.error("tool call failed: %s", exc)
        return _error(str(exc), 500, "server_error")


async def _streamed(tool, params: dict):
    """The tool runs in a thread; its output chunks become events here until it is done or the
    client leaves (the chunk callback then answers False, which ends the command)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    gone = False

    def push(chunk: str) -> bool:
        if chunk:
            loop.call_soon_threadsafe(queue.put_nowait, ("chunk", chunk))
        return not gone

    def work() -> None:
        error = ""
        try:
            tool.invoke(params, push)
        except (ToolParamError, ToolRuntimeError) as exc:
            error = str(exc)
        except Exception as exc:  # the stream still ends with a done event
            log.exception("streamed tool call failed")
            error = str(exc) or "An unknown error occurred"
        loop.call_soon_threadsafe(queue.put_nowait, ("done", error))

    worker = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        while True:
            kind, value = await queue.get()
            if kind == "chunk":
                yield event({"chunk": value})
            else:
                yield event({"done": True, **({"error": value} if value else {})})
                return
    finally:
        gone = True  # a client that left: the command is ended at its next chunk
        worker.add_done_callback(lambda f: f.exception())  # its outcome is in the events, or nobody's


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    router.add_api_route("/tools", get_tools, methods=["GET"])
    router.add_api_route("/tools", post_tools, methods=["POST"])
