"""What one request may ask of the server, and the ASGI guard that holds request bodies to it.

Upstream llama-server bounds a request only by its context size; a server behind chat UIs and
scripts needs a few more limits so that no single request can exhaust memory or the queue. Each is
a flag with a default that no ordinary client reaches:

- ``--max-body-size`` (bytes, default 8 MiB): larger bodies get 413 before they are read whole
  (this also bounds the tokenizing one request can ask for, about a second per megabyte);
- ``--max-prompt-tokens`` (default 0: the context size is the only bound);
- ``--max-queue`` (default 256, or ``MLXCEL_MAX_QUEUE``): accepted requests waiting for a slot;
  past it new requests get 503 at once;

A few bounds are fixed rather than flags, because no legitimate request comes near them: at most
:data:`MAX_STOP_STRINGS` stop strings of :data:`MAX_STOP_CHARS` characters in all, JSON bodies
at most :data:`MAX_JSON_DEPTH` levels deep, and a body that arrives whole within
:data:`BODY_DEADLINE_S` seconds of its headers (or ``--timeout``, when shorter): a client that
drips its body a byte at a time never stalls, so the read timeout alone would never end it. (The
headers' own deadline and the connections one address may hold are the listener's:
``cli/connection_guard.py``.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from mlxcel.engine.platform.settings import settings
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.runtime.errors import ApiError, body_timeout, invalid, payload_too_large

DEFAULT_MAX_BODY = 8 * 1024 * 1024
_EXPIRED = float("inf")
DEFAULT_MAX_QUEUE = 256
MAX_STOP_STRINGS = 256
MAX_STOP_CHARS = 16384
MAX_JSON_DEPTH = 64


@dataclass(frozen=True)
class Limits:
    max_body: int = DEFAULT_MAX_BODY
    max_prompt_tokens: int = 0  # 0: only the context bounds a prompt
    max_queue: int = DEFAULT_MAX_QUEUE

    @classmethod
    def from_config(cls, config) -> Limits:
        queue = config.max_queue
        if queue is None:
            forced = settings().max_queue
            queue = DEFAULT_MAX_QUEUE if forced is None else forced
        return cls(max_body=config.max_body_size, max_prompt_tokens=config.max_prompt_tokens,
                   max_queue=max(1, queue))

    def check_prompt(self, n_tokens: int) -> None:
        if self.max_prompt_tokens > 0 and n_tokens > self.max_prompt_tokens:
            raise invalid(f"the prompt has {n_tokens} tokens; this server accepts at most "
                          f"{self.max_prompt_tokens} (--max-prompt-tokens)")


def check_stops(stops: list[str]) -> None:
    """Stop strings are checked against the text after every token (and, when streaming, every
    suffix of it against every prefix of each), so their number and total length are bounded."""
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"Field 'stop': at most {MAX_STOP_STRINGS} stop strings are accepted, but got {len(stops)}")
    total = sum(len(stop) for stop in stops)
    if total > MAX_STOP_CHARS:
        raise invalid(f"Field 'stop': the stop strings may have at most {MAX_STOP_CHARS} characters in all, "
                      f"but have {total}")


# The whole body must arrive within this many seconds of the request's headers however steadily it
# trickles in (a byte a second never stalls), or within --timeout when that is shorter; a
# --max-body-size past 7.5 MiB gets longer, at BODY_MIN_RATE (8 MiB: 64 s, about 130 kB/s).
BODY_DEADLINE_S = 60.0
BODY_MIN_RATE = 128 * 1024  # bytes a second


def whole_body_seconds(limit: int, read_timeout: float) -> float:
    """How long a request's whole body may take to arrive (see :data:`BODY_DEADLINE_S`)."""
    seconds = max(BODY_DEADLINE_S, limit / BODY_MIN_RATE)
    return min(seconds, read_timeout) if read_timeout > 0 else seconds


class BodyLimit:
    """Wraps an ASGI ``receive`` so a body past ``limit`` bytes is refused with 413 (at once when
    ``Content-Length`` says so, else as soon as the chunks received pass it), and with 408 a body
    that stalls for ``read_timeout`` seconds (upstream's ``--timeout`` is a read timeout) or that
    has not arrived whole :func:`whole_body_seconds` after the headers."""

    def __init__(self, limit: int, read_timeout: float = 0.0):
        self.limit = limit
        self.read_timeout = read_timeout
        self.whole_body_s = whole_body_seconds(limit, read_timeout)
        self._reading: dict[asyncio.Task, float] = {}  # body reads in progress -> deadline
        self._watchdog: asyncio.Task | None = None
        self._watchdog_loop = None

    def declared_too_large(self, scope) -> int | None:
        """The declared length when it is over the limit (or unparseable: -1), else None."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    return -1
                return size if size > self.limit or size < 0 else None
        return None

    def wrap(self, receive):
        """``receive`` held to the limits; called as the request starts (its headers are in)."""
        seen = 0
        done = False  # the whole body arrived: later receives wait for a disconnect, untimed
        limit = self.limit
        whole_by = asyncio.get_running_loop().time() + self.whole_body_s

        async def limited():
            nonlocal seen, done
            if done:
                message = await receive()
            else:
                message = await self._timed(receive, whole_by)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyRefused(payload_too_large(None, limit))
                done = not message.get("more_body", False)
            return message

        return limited

    async def _timed(self, receive, whole_by: float):
        """``receive()``, cancelled by the watchdog if it waits past the read timeout or past
        ``whole_by``, the whole body's deadline. A dict entry per read instead of a timer per read:
        the common case (the body is already there) costs well under a microsecond."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if self._watchdog is None or self._watchdog_loop is not loop:
            self._watchdog_loop, self._watchdog = loop, loop.create_task(self._watch())
        stall_by = loop.time() + self.read_timeout if self.read_timeout > 0 else float("inf")
        self._reading[task] = min(stall_by, whole_by)
        try:
            return await receive()
        except asyncio.CancelledError:
            if self._reading.get(task) == _EXPIRED:
                task.uncancel()
                raise (BodyTimeout(self.read_timeout) if stall_by < whole_by else
                       BodyTimeout(self.whole_body_s, whole=True)) from None
            raise
        finally:
            self._reading.pop(task, None)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        positive = [t for t in (self.read_timeout, self.whole_body_s) if t > 0]
        while True:
            await asyncio.sleep(min(1.0, *positive))
            now = loop.time()
            for task, deadline in list(self._reading.items()):
                if now > deadline:
                    self._reading[task] = _EXPIRED
                    task.cancel()

    async def refuse(self, size: int | None, scope, receive, send) -> None:
        err = payload_too_large(size if size and size > 0 else None, self.limit)
        await JsonResponse(err.body(), status_code=err.status, headers={"Connection": "close"})(scope, receive, send)


class BodyRefused(Exception):
    """Raised inside a handler's body read (too large, or stalled); the app answers with
    ``error`` and closes the connection."""

    def __init__(self, error):
        super().__init__(error.message)
        self.error = error


class BodyTimeout(BodyRefused):
    """408: the body stalled for ``seconds`` (or, ``whole``, did not arrive whole within them)."""

    def __init__(self, seconds: float, whole: bool = False):
        super().__init__(ApiError(f"the request body did not arrive whole within {seconds:g} s of its headers",
                                  "invalid_request_error", status=408) if whole else body_timeout(seconds))
