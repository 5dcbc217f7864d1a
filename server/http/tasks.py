"""The HTTP side of a request's tasks: opening them on the scheduler, waiting for their results
while watching for a client that went away, and merging several tasks' events into one stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

from mlxcel.server.http.disconnects import ClientGone
from mlxcel.server.http.plan import CompletionPlan
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.scheduler import TaskHandle
from mlxcel.server.runtime.task import Result

T = TypeVar("T")


def open_tasks(state: ServerState, plan: CompletionPlan) -> list[TaskHandle]:
    """One task per completion of each prompt (index ``p * n + k``), queued now; on a refusal the
    ones already queued are cancelled. An encoder-only model (embeddings, rerank) generates nothing:
    refused here, the one place every generating route queues its work."""
    if state.embedder is not None:
        state.embedder.check_generates()
    handles: list[TaskHandle] = []
    try:
        for p, tokens in enumerate(plan.prompts):
            for k in range(plan.n):
                handles.append(state.scheduler.open(tokens, plan.options, index=p * plan.n + k,
                                                    t_arrival=plan.t_arrival, media=plan.media_of(p * plan.n + k)))
    except BaseException:
        for h in handles:
            h.cancel()
        raise
    return handles


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client goes away first, cancel it (freeing its slots) and raise
    :class:`ClientGone`, which ends the request without an error log (``disconnects.py``)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone("client disconnected")
    finally:
        if not task.done():
            task.cancel()


async def gather_results(handles: list[TaskHandle]) -> list[Result]:
    try:
        return list(await asyncio.gather(*(h.result() for h in handles)))
    finally:
        for h in handles:
            h.cancel()


async def merged_events(handles: list[TaskHandle]) -> AsyncIterator[tuple[int, Any]]:
    """Events of several tasks as they come: ``(position in handles, event)``."""
    if len(handles) == 1:
        async for ev in handles[0].events():
            yield 0, ev
        return
    queue: asyncio.Queue = asyncio.Queue()
    sentinel = object()

    async def pump(i: int, handle: TaskHandle):
        try:
            async for ev in handle.events():
                await queue.put((i, ev))
        except BaseException as exc:
            await queue.put((i, exc))
        finally:
            await queue.put((i, sentinel))

    pumps = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    remaining = len(handles)
    try:
        while remaining:
            i, ev = await queue.get()
            if ev is sentinel:
                remaining -= 1
                continue
            if isinstance(ev, BaseException):
                raise ev
            yield i, ev
    finally:
        for p in pumps:
            p.cancel()
        for h in handles:
            h.cancel()


PING = object()  # what with_pings yields for a silence


async def with_pings(events: AsyncIterator[T], every_s: float) -> AsyncIterator[T | object]:
    """``events``, with :data:`PING` yielded after every ``every_s`` seconds without one (none when
    ``every_s`` <= 0)."""
    if every_s <= 0:
        async for item in events:
            yield item
        return
    iterator = events.__aiter__()
    pending = asyncio.ensure_future(iterator.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield PING
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            yield item
            pending = asyncio.ensure_future(iterator.__anext__())
    finally:
        if not pending.done():
            pending.cancel()
        await iterator.aclose()
