"""``--sleep-idle-seconds N``: unload the model after N idle seconds, load it again on demand.

As upstream: the server is idle when no request that uses the model is in flight, and it has been
N seconds since the last one ended. It then goes to sleep: the scheduler (with every slot's KV
cache and the drafter) and the model are dropped and MLX's buffer cache is freed. The next request
that needs the model wakes it (the request waits while the model loads again) and the idle clock
starts over.

What answers while asleep without waking anything and without resetting the idle clock is
upstream's list: ``GET /health``, ``GET /props``, ``GET /models`` (and ``/v1/models``), ``GET
/metrics``; the last three answer from a snapshot taken on entering sleep (``/props`` then says
``"is_sleeping": true``). Routes that never touch the model (``/tools``, ``/cors-proxy``, the
OpenAPI document, the root page, unknown paths) neither wake the model nor count as activity.

The throughput gauges of ``/metrics`` are windows between two scrapes. Entering sleep keeps the
current window in the snapshot: the first scrape while asleep reports it, later ones report an
empty window, and once a scrape has reported it waking starts a fresh window, so that no window is
reported twice.

State changes run on the event loop (so a request is either counted as in flight or sees the
sleeping flag, never neither), under one lock; the unload and the reload run in a worker thread.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
import time
from collections.abc import Callable

from starlette.routing import Match

from mlxcel.server.http import model_info
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import unavailable
from mlxcel.server.runtime.metrics import Metrics

log = logging.getLogger(__name__)

# (method, path) that answer while asleep, do not wake the model and do not count as activity
READ_ONLY = {("GET", "/health"), ("GET", "/v1/health"), ("GET", "/props"), ("GET", "/models"),
             ("GET", "/v1/models"), ("GET", "/metrics")}
# routes that never use the model: they are neither activity nor a reason to wake (the page and
# the --path files too)
MODEL_FREE = {"/tools", "/cors-proxy", "/openapi.json", "/", "/index.html", "/{path:path}"}
CHECK_EVERY_S = 0.1


class IdleSleep:
    def __init__(self, state: ServerState, idle_seconds: float, reload: Callable[[], None], unload: Callable[[], None]):
        self.state = state
        self.idle_seconds = idle_seconds
        self._reload = reload  # loads the model into state again (blocking)
        self._unload = unload  # drops it (blocking)
        self.sleeping = False
        self.in_flight = 0
        self.last_active = time.monotonic()
        self.props: dict = {}
        self.models: dict = {}
        self._metrics: Metrics | None = None  # the snapshot /metrics reads while asleep
        self._scraped_asleep = False  # a scrape reported the snapshot's window
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start watching for idleness (call on the event loop, e.g. in the app's lifespan)."""
        self._lock = asyncio.Lock()
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            if not self.sleeping and not self.state.ready:  # still loading: the clock starts once loaded
                self.last_active = time.monotonic()
            elif (not self.sleeping and self.state.ready and self.in_flight == 0
                    and time.monotonic() - self.last_active >= self.idle_seconds):
                await self._enter()

    async def _enter(self) -> None:
        async with self._lock:
            if self.sleeping or self.in_flight or not self.state.ready:
                return
            state = self.state
            self.props = {**model_info.props(state), "is_sleeping": True}
            self.models = model_info.models(state)
            self._metrics = copy.deepcopy(state.metrics)
            self._scraped_asleep = False
            self.sleeping = True
            log.info("server is entering sleeping state (idle for %g s): unloading the model", self.idle_seconds)
            await asyncio.to_thread(self._unload)

    async def _wake(self) -> None:
        async with self._lock:
            if not self.sleeping:
                return
            log.info("server is exiting sleeping state: loading the model")
            t0 = time.monotonic()
            await asyncio.to_thread(self._reload)
            if self._scraped_asleep:  # that window was reported while asleep
                self.state.metrics.reset_buckets()
            self.sleeping = False
            self.last_active = time.monotonic()
            log.info("model loaded again in %.1f s", self.last_active - t0)

    # -- requests ----------------------------------------------------------------------------
    def metrics_text(self, render: Callable[[Metrics], str]) -> str:
        """``/metrics`` while asleep: the snapshot, whose window empties once reported."""
        text = render(self._metrics)
        self._metrics.reset_buckets()
        self._scraped_asleep = True
        return text

    def _uses_model(self, scope) -> bool:
        method, path = scope.get("method", "GET"), scope.get("path", "")
        prefix = self.state.config.api_prefix
        if prefix and path.startswith(prefix):
            path = path[len(prefix):] or "/"
        if (method, path) in READ_ONLY:
            return False
        app = scope.get("app")  # the application (Starlette puts itself in the scope)
        for route in app.router.routes if app is not None else ():
            if route.matches(scope)[0] == Match.FULL:
                route_path = getattr(route, "path", "")
                prefix = self.state.config.api_prefix
                return route_path.removeprefix(prefix) not in MODEL_FREE if prefix else route_path not in MODEL_FREE
        return False  # a 404 wakes nothing

    async def serve(self, app, scope, receive, send) -> None:
        """Run one request: wake the model first if the request needs it, and count it as activity."""
        if not self._uses_model(scope):
            return await app(scope, receive, send)
        self.in_flight += 1
        try:
            if self.sleeping:
                try:
                    await self._wake()
                except Exception as exc:  # the model is gone: every request says so, as at startup
                    log.error("reloading the model failed: %s", exc)
                    self.state.load_error = str(exc)
                    self.sleeping = False
            if not self.state.ready:
                error = unavailable(f"Model failed to load: {self.state.load_error}")
                return await JsonResponse(error.body(), status_code=503)(scope, receive, send)
            await app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.last_active = time.monotonic()


def unload(state: ServerState) -> None:
    """Drop the scheduler (slots, KV caches, drafter) and the model, and free MLX's buffers."""
    import mlx.core as mx  # noqa: PLC0415 -- deferred: MLX loads only in the serving process

    scheduler, state.scheduler = state.scheduler, None
    if scheduler is not None:
        scheduler.stop()
    state.loaded = None
    state.token_text = None
    del scheduler
    gc.collect()
    mx.clear_cache()
