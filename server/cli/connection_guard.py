"""Limits on connections, below HTTP requests: how long a request's headers may take, and how
many connections one address may hold.

uvicorn's HTTP/1.1 protocols time nothing until a request's headers are complete: a connection
that sends nothing, or sends its headers a byte a second, is kept forever (its keep-alive timer is
re-armed by every byte). Each such connection costs a file descriptor, so a client opening many of
them runs the server out of descriptors, and then nobody can connect. :func:`guarded_protocol`
subclasses uvicorn's protocol with both limits:

- the request line and headers must arrive within :data:`HEADER_DEADLINE_S` seconds (or
  ``--timeout``, when shorter) of the connection opening, or of the first byte of a later request
  on a kept-alive connection. Past it a connection that sent nothing is closed, one that sent part
  of a request gets 408 and is closed;
- at most ``MLXCEL_MAX_CONNECTIONS_PER_IP`` (default :data:`DEFAULT_MAX_PER_IP`, 0: no limit)
  connections at once from one address. A connection past it gets 503 for its first request (its
  headers allowed only :data:`REFUSED_HEADER_S` seconds) and is closed. Upstream has no per-address
  limit (its thread pool serves about a thousand connections in all); a browser opens at most six
  to a host, and one client needing more than 64 at once would mostly wait in the queue anyway.

Connections over a UNIX socket have no address and no per-address limit. A router's child servers
are reached only by the router, over loopback, so it lifts the limit for them (``serving.py``).
"""

from __future__ import annotations

import asyncio
import logging

from mlxcel.engine.platform.settings import settings, variable
from mlxcel.server.http.sse import JsonResponse, dumps
from mlxcel.server.runtime.errors import ApiError, unavailable

log = logging.getLogger(__name__)

HEADER_DEADLINE_S = 10.0
REFUSED_HEADER_S = 2.0
DEFAULT_MAX_PER_IP = 64
MAX_PER_IP_ENV = variable("max_connections_per_ip")


def max_per_ip() -> int:
    """The per-address connection limit ``MLXCEL_MAX_CONNECTIONS_PER_IP`` asks for (0: none)."""
    forced = settings().max_connections_per_ip
    return DEFAULT_MAX_PER_IP if forced is None else forced


def header_deadline(timeout: float) -> float:
    """Seconds a request's headers may take: :data:`HEADER_DEADLINE_S`, or ``--timeout`` if shorter."""
    return min(HEADER_DEADLINE_S, timeout) if timeout > 0 else HEADER_DEADLINE_S


def _headers_late_response(seconds: float) -> bytes:
    """The whole 408 response (closing the connection) for headers that did not arrive in time:
    written straight to the socket, as no request exists for uvicorn to answer."""
    error = ApiError(f"the request headers did not arrive within {seconds:g} s", "invalid_request_error", status=408)
    body = dumps(error.body())
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)) + body


def _too_many(limit: int):
    """The ASGI app a connection past the per-address limit is served by: 503, then close."""
    error = unavailable(f"too many connections from one address: this server accepts at most {limit} at a "
                        f"time ({MAX_PER_IP_ENV})")

    async def refuse(scope, receive, send):
        await JsonResponse(error.body(), status_code=error.status, headers={"Connection": "close"})(
            scope, receive, send)

    return refuse


def guarded_protocol(base: type[asyncio.Protocol], headers_within: float, per_ip: int) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's h11 or httptools protocol) with the header deadline and the
    per-address limit; one class per server, holding that server's connection counts."""
    counts: dict[str, int] = {}

    class GuardedProtocol(base):  # type: ignore[valid-type, misc]
        _peer: str | None = None
        _timer: asyncio.TimerHandle | None = None
        _partial = False  # bytes of a request whose headers are not complete yet

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self._peer = peer[0] if isinstance(peer, tuple) and peer else None
            within = headers_within
            if self._peer is not None:
                n = counts[self._peer] = counts.get(self._peer, 0) + 1
                if per_ip and n > per_ip:
                    if n == per_ip + 1:
                        log.warning("%s holds %d connections (%s=%d): refusing more", self._peer, n - 1,
                                    MAX_PER_IP_ENV, per_ip)
                    self.app = _too_many(per_ip)
                    within = min(within, REFUSED_HEADER_S)
            self._arm(within)

        def data_received(self, data: bytes) -> None:
            if self._timer is None and self._between_requests():
                self._arm(headers_within)  # a later request on a kept-alive connection
            self._partial = True
            cycle = self.cycle
            super().data_received(data)
            if self._timer is not None and self.cycle is not cycle:  # its headers are complete
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self._peer is not None:
                left = counts.get(self._peer, 1) - 1
                if left > 0:
                    counts[self._peer] = left
                else:
                    counts.pop(self._peer, None)
                self._peer = None
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._partial = False
            self._timer = self.loop.call_later(seconds, self._headers_late, seconds)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _headers_late(self, seconds: float) -> None:
            self._timer = None
            if self.transport.is_closing() or not self._between_requests():
                return
            if self._partial:
                log.info("%s: no complete request headers within %g s: 408, connection closed", self._peer, seconds)
                self.transport.write(_headers_late_response(seconds))
            self.transport.close()

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{base.__name__}"
    return GuardedProtocol
