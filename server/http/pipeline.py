"""The one completion pipeline every completion-style route runs:

    body -> plan (``format.plan``: every check, once) -> tasks on the scheduler
         -> stream: events -> ``format.stream`` chunks -> SSE
         -> or gather: results -> ``format.body`` -> JSON

The pipeline knows nothing of any API's shapes; a :class:`ResponseFormat` knows nothing of tasks,
events or transport. A completion-style API is a package under ``api/`` with its format, whose
routes are :func:`completion_route` handlers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from mlxcel.server.http.disconnects import ClientGone
from mlxcel.server.http.formats.base import CompletionStream, ResponseFormat
from mlxcel.server.http.schema import parse_body
from mlxcel.server.http.sse import DONE, JsonResponse, event_stream
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.tasks import PING, gather_results, merged_events, open_tasks, until_disconnect, with_pings
from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.runtime.scheduler import TaskHandle
from mlxcel.server.runtime.task import Final, Partial, Progress

# A body past this many bytes is decoded in a worker thread: decoding a few megabytes of numbers or
# small objects takes seconds (every float goes through a range check), and the event loop must
# keep serving everyone else meanwhile; below it the thread hop costs more than decoding inline.
INLINE_DECODE_MAX = 64 * 1024


async def read_body(request: Request) -> dict:
    """The request's JSON object body (a 400 for anything else); :class:`ClientGone` when the
    client hangs up while sending it."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ClientGone("the client disconnected while sending the body") from None
    if len(raw) <= INLINE_DECODE_MAX:
        return parse_body(raw)
    return await asyncio.to_thread(parse_body, raw)


async def json_response(content) -> JsonResponse:
    """``content`` as a JSON response, serialized in a worker thread (a body of many vectors or
    token probabilities is megabytes of JSON)."""
    return await asyncio.to_thread(JsonResponse, content)


async def complete(request: Request, fmt: ResponseFormat) -> Response:
    """Serve one completion request in ``fmt``'s shapes."""
    t_arrival = time.perf_counter()
    state: ServerState = request.app.state.server
    # Off the event loop: rendering a template, tokenizing a long prompt or compiling a grammar takes
    # milliseconds to seconds, and every other client's stream and /health wait while the loop is busy.
    plan = await asyncio.to_thread(fmt.plan, state, await read_body(request), t_arrival)
    handles = open_tasks(state, plan)
    indices = [h.index for h in handles]
    if plan.stream:
        return event_stream(_chunks(fmt.stream(state, plan, indices), handles, plan.options.sse_ping_interval))
    results = await until_disconnect(request, gather_results(handles))
    return await json_response(fmt.body(state, plan, results, indices))


def completion_route(fmt: ResponseFormat):
    """The route handler that serves one completion request in ``fmt``'s shapes (named after the
    format, so the route table says which API a path serves)."""
    async def handle(request: Request) -> Response:
        return await complete(request, fmt)

    handle.__name__ = f"{type(fmt).__name__.removesuffix('Format').lower()}_completion"
    return handle


async def _chunks(writer: CompletionStream, handles: list[TaskHandle], ping_s: int = -1) -> AsyncIterator[bytes]:
    """The SSE frames of one streamed response; a failure ends it with an error event. With
    ``ping_s`` > 0 (``sse_ping_interval``) the writer's ping goes out after that many silent seconds."""
    try:
        for chunk in writer.opening():
            yield writer.frame(chunk)
        async for item in with_pings(merged_events(handles), ping_s):
            if item is PING:
                yield writer.ping
                continue
            i, ev = item
            index = handles[i].index
            if isinstance(ev, Partial):
                chunks = writer.partial(index, ev)
            elif isinstance(ev, Progress):
                chunks = writer.progress(index, ev)
            elif isinstance(ev, Final):
                chunks = writer.final(index, ev.result)
            else:
                raise TypeError(f"unexpected task event {type(ev).__name__}")
            for chunk in chunks:
                yield writer.frame(chunk)
        if writer.done_marker:
            yield DONE
    except ApiError as exc:
        for chunk in writer.failed(exc):
            yield writer.frame(chunk)


