"""A client that hangs up before its answer is ready is a normal event, not a server error.

A non-streamed request notices the hang-up while it waits for its work (``tasks.until_disconnect``)
or while it reads its body (``pipeline.read_body``) and raises :class:`ClientGone`; its work is
cancelled on the way out (a ``CancelledError``, so every ``finally`` and cancellation handler
runs). :class:`QuietDisconnects` sits outside the app and ends such a request with one INFO line,
where uvicorn would log "Exception in ASGI application" and a full traceback. No answer is sent:
there is nobody to read it.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class ClientGone(asyncio.CancelledError):
    """The client closed the connection before its answer was ready; the request's work is
    cancelled."""


class QuietDisconnects:
    """ASGI wrapper: a request ended by :class:`ClientGone` returns quietly (one INFO line)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        except ClientGone:
            log.info("%s %s: the client disconnected before the answer; its work was cancelled",
                     scope.get("method", ""), scope.get("path", ""))
