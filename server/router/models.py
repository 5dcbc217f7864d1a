"""The router's models and their servers: one child ``mlxcel-server`` process per loaded model
(``127.0.0.1``, a free port, ``--alias <name>``), as upstream runs one child llama-server each.
Each child takes requests only with the router's private credential (``child_access``).

Status, as upstream reports it on ``/models``: ``unloaded`` -> ``loading`` (spawned, not answering
``/health`` yet) -> ``loaded`` <-> ``sleeping`` (the child's own ``--sleep-idle-seconds``) ->
``unloaded`` (with the exit code when it failed). A model ``POST /models`` adds is ``downloading``
first (``downloads.py``; it holds no slot), then ``unloaded``. Stopping a child is SIGTERM (its clean shutdown),
then SIGKILL after the model's ``stop-timeout`` (default 10 s); a child still loading is killed.

Capacity (``--models-max``, default 4; 0 = unlimited) is upstream's scheduler: a request for a
model that is not running joins a FIFO queue (requests for the same model share one entry and one
load); while queued requests outnumber the free slots, the least recently used idle model is
stopped (never one serving a request, one still loading, or one a queued request wants); the head
of the queue loads when a slot is free. ``POST /models/load`` evicts the least recently used idle
model at once when full. Everything runs on the event loop, so no locks: each change of state
wakes the waiters, who re-check.

``LLAMA_SERVER_DEBUG_FAKE_TIMING`` (upstream's test switch, set by its test harness) adds 2 s to
each load and to each proxied request after it is counted, so tests can see a model busy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

import httpx

from mlxcel.server.router import child_access
from mlxcel.server.router.catalog import ModelEntry
from mlxcel.server.router.options import to_argv

log = logging.getLogger(__name__)

CHILD_HOST = "127.0.0.1"
ADDED = "cache"  # the source of a model POST /models added (upstream's name: it lives in the hub cache)
POLL_S = 0.1
SLEEP_POLL_S = 1.0


class RouterError(Exception):
    """An operation the router refuses; ``status`` and ``type`` shape the error body."""

    def __init__(self, message: str, status: int = 400, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.type = status, type_


@dataclass
class Instance:
    entry: ModelEntry
    status: str = "unloaded"
    port: int = 0
    proc: asyncio.subprocess.Process | None = None
    req_count: int = 0
    last_used: float = 0.0
    exit_code: int = 0
    loaded_info: dict = field(default_factory=dict)
    args: list[str] = field(default_factory=list)  # the child's command line (its secrets: in its environment)
    env: dict[str, str] = field(default_factory=dict)  # secret settings passed by environment
    stopping: bool = False

    @property
    def public_args(self) -> list[str]:
        """The command line as ``GET /models`` shows it (nothing that leads to the child)."""
        return child_access.public_args(self.args)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded", "sleeping")

    @property
    def ready_or_sleep(self) -> bool:
        return self.status in ("loaded", "sleeping")

    @property
    def failed(self) -> bool:
        return self.status == "unloaded" and self.exit_code != 0


@dataclass
class _Waiting:
    model: str
    n_waiters: int = 1
    loading: bool = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind((CHILD_HOST, 0))
        return s.getsockname()[1]


class Models:
    def __init__(self, catalog: dict[str, ModelEntry], router_options: dict[str, str], models_max: int,
                 autoload: bool):
        self.instances: dict[str, Instance] = {name: Instance(entry) for name, entry in catalog.items()}
        self.router_options = router_options
        self.models_max = models_max
        self.autoload = autoload
        self.fake_timing = bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))
        self._queue: list[_Waiting] = []
        self._changed = asyncio.Event()
        self._subscribers: set[asyncio.Queue] = set()
        self._tasks: set[asyncio.Task] = set()
        self.stopping = False
        self.credential = child_access.new_credential()  # the children's only API key
        for inst in self.instances.values():
            self._set_argv(inst, 0)

    # -- lookups -------------------------------------------------------------------------------
    def find(self, name: str) -> Instance | None:
        inst = self.instances.get(name)
        if inst is not None:
            return inst
        return next((i for i in self.instances.values() if name in i.entry.aliases), None)

    def _set_argv(self, inst: Instance, port: int) -> None:
        options, inst.env = child_access.split_secrets(inst.entry.child_options(self.router_options))
        inst.args = [sys.executable, "-m", "mlxcel.server.cli", *to_argv(options), "--host", CHILD_HOST,
                     "--port", str(port), "--alias", inst.name]

    # -- events ----------------------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(maxsize=1024)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self._subscribers.discard(q)

    def broadcast(self, event: str, model: str, data: dict | None = None) -> None:
        message = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for q in list(self._subscribers):
            if not q.full():
                q.put_nowait(message)

    def _set_status(self, inst: Instance, status: str, exit_code: int = 0, info: dict | None = None) -> None:
        inst.status = status
        inst.exit_code = exit_code
        if status == "unloaded":
            inst.stopping = False
        if info is not None:
            inst.loaded_info = info
        data: dict = {"status": status}
        if status == "unloaded":
            data["exit_code"] = exit_code
        if info is not None:
            data["info"] = info
        self.broadcast("status_change", inst.name, data)
        self._tick()
        self._notify()

    def add(self, entry: ModelEntry, status: str = "unloaded") -> Instance:
        """A model that joins the list while the router runs (``POST /models``); a reload keeps it."""
        inst = self.instances[entry.name] = Instance(entry, status=status)
        self._set_argv(inst, 0)
        self.broadcast("model_status", entry.name, {"status": status})
        self._notify()
        return inst

    def downloaded(self, name: str) -> None:
        """A model ``add`` listed as downloading has its files: it is ``unloaded``, loadable, now."""
        inst = self.instances.get(name)
        if inst is not None and inst.status == "downloading":
            self._set_status(inst, "unloaded")

    def discard(self, name: str) -> None:
        """Drop a model ``add`` added whose download failed."""
        if self.instances.pop(name, None) is not None:
            self._notify()

    def background(self, coro) -> None:
        """Run ``coro`` as a task the router holds on to until it ends."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- scheduler ---------------------------------------------------------------------------------
    def _count_running(self) -> int:
        return sum(1 for i in self.instances.values() if i.running)

    def _has_capacity(self) -> bool:
        return self.models_max <= 0 or self._count_running() < self.models_max

    def _queued(self, name: str) -> _Waiting | None:
        return next((w for w in self._queue if w.model == name), None)

    def _pick_victim(self) -> Instance | None:
        victims = [i for i in self.instances.values()
                   if i.req_count == 0 and i.ready_or_sleep and not i.stopping and self._queued(i.name) is None]
        return min(victims, key=lambda i: i.last_used, default=None)

    def _join(self, name: str) -> None:
        waiting = self._queued(name)
        if waiting is not None:
            waiting.n_waiters += 1
        else:
            self._queue.append(_Waiting(name))
            log.info("request for name=%s queued at position %d", name, len(self._queue))

    def _leave(self, name: str) -> None:
        waiting = self._queued(name)
        if waiting is not None:
            waiting.n_waiters -= 1
            if waiting.n_waiters <= 0:
                self._queue.remove(waiting)

    def _try_claim(self, name: str) -> bool:
        if not self._queue or self._queue[0].model != name or self._queue[0].loading or not self._has_capacity():
            return False
        self._queue[0].loading = True
        return True

    def _claim_done(self, name: str, ok: bool) -> None:
        if not ok:
            waiting = self._queued(name)
            if waiting is not None:
                waiting.loading = False

    def _tick(self) -> None:
        """Evict idle models while queued requests outnumber the slots free or being freed."""
        if self.models_max <= 0 or not self._queue:
            return
        running = [i for i in self.instances.values() if i.running]
        n_stopping = sum(1 for i in running if i.stopping)
        n_needed = sum(1 for w in self._queue if not w.loading)
        n_claimed = sum(1 for w in self._queue if w.loading and not self.instances[w.model].running)
        n_free = self.models_max - len(running) + n_stopping - n_claimed
        while n_free < n_needed:
            victim = self._pick_victim()
            if victim is None:
                return
            log.info("evicting idle LRU name=%s for a queued request", victim.name)
            self._request_stop(victim)
            n_free += 1

    # -- lifecycle -------------------------------------------------------------------------------------
    async def load(self, name: str) -> None:
        """Spawn the model's server (it is then ``loading``); evicts the LRU idle model when full."""
        if self.fake_timing:
            await asyncio.sleep(2)
        inst = self.instances.get(name)
        if inst is None:
            raise RouterError(f"model name={name} is not found", 404, "not_found_error")
        await self._unload_lru()
        if inst.status != "unloaded":
            return
        if self.models_max > 0 and self._count_running() >= self.models_max:
            raise RouterError("model limit reached, try again later", 503, "unavailable_error")
        inst.port = free_port()
        self._set_argv(inst, inst.port)
        inst.loaded_info = {}
        inst.last_used = time.monotonic()
        log.info("spawning server instance with name=%s on port %d: %s", name, inst.port, " ".join(inst.args))
        try:
            inst.proc = await asyncio.create_subprocess_exec(
                *inst.args, stdin=asyncio.subprocess.DEVNULL, env=child_access.child_env(self.credential, inst.env))
        except OSError as exc:  # its text names the program's path: the log has it, the client does not
            log.error("failed to spawn server instance name=%s: %s", name, exc)
            raise RouterError(f"failed to spawn server instance: {exc.strerror or type(exc).__name__}", 500,
                              "server_error") from None
        inst.status = "loading"
        self.broadcast("model_status", name, {"status": "loading"})
        self._notify()
        task = asyncio.create_task(self._monitor(inst, inst.proc))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unload_lru(self) -> None:
        if self.models_max <= 0 or self._has_capacity():
            return
        victim = self._pick_victim()
        if victim is None:
            return
        log.info("models_max limit reached, removing LRU name=%s", victim.name)
        self._request_stop(victim)
        while victim.status != "unloaded":
            await self._wait_change(POLL_S)

    async def _monitor(self, inst: Instance, proc: asyncio.subprocess.Process) -> None:
        """Watch one child: ready once ``/health`` answers, sleeping while its ``/props`` says so,
        unloaded when it exits."""
        base = f"http://{CHILD_HOST}:{inst.port}"
        exited = asyncio.create_task(proc.wait())
        async with httpx.AsyncClient(timeout=5.0, headers=child_access.auth_headers(self.credential)) as client:
            while not exited.done():
                try:
                    if inst.status == "loading":
                        if (await client.get(base + "/health")).status_code == 200:
                            models = (await client.get(base + "/v1/models")).json()
                            info = (models.get("data") or [{}])[0]
                            self._set_status(inst, "loaded", info=info)
                            continue
                    elif inst.ready_or_sleep:
                        sleeping = bool((await client.get(base + "/props")).json().get("is_sleeping"))
                        wanted = "sleeping" if sleeping else "loaded"
                        if inst.status != wanted:
                            self._set_status(inst, wanted)
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.wait({exited}, timeout=POLL_S if inst.status == "loading" else SLEEP_POLL_S)
        code = exited.result()
        if inst.proc is proc:
            inst.proc = None
            log.info("instance name=%s exited with status %s", inst.name, code)
            exit_code = 0 if inst.stopping or code in (0, -signal.SIGTERM) else (code if code > 0 else 1)
            self._set_status(inst, "unloaded", exit_code=exit_code)

    def _request_stop(self, inst: Instance) -> None:
        if inst.stopping or inst.proc is None:
            return
        inst.stopping = True
        proc = inst.proc
        if inst.status == "loading":  # nothing to finish: killed at once
            proc.kill()
            return
        proc.send_signal(signal.SIGTERM)

        async def force() -> None:
            try:
                await asyncio.wait_for(proc.wait(), inst.entry.stop_timeout)
            except TimeoutError:
                log.warning("instance name=%s did not stop in %g s, killing it", inst.name, inst.entry.stop_timeout)
                proc.kill()

        task = asyncio.create_task(force())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def unload(self, name: str) -> None:
        inst = self.instances[name]
        if inst.running:
            log.info("stopping model instance name=%s", name)
            self._request_stop(inst)

    async def unload_all(self) -> None:
        self.stopping = True
        for inst in self.instances.values():
            self._request_stop(inst)
        procs = [i.proc for i in self.instances.values() if i.proc is not None]
        if procs:
            await asyncio.gather(*(p.wait() for p in procs), return_exceptions=True)

    async def reconcile(self, catalog: dict[str, ModelEntry]) -> None:
        """``GET /models?reload=1``: the sources read again. A running model whose settings changed
        or that is gone is stopped first; then gone models leave the list, the others take their new
        settings and new ones are added (not loaded)."""
        changed = [name for name, inst in self.instances.items()
                   if inst.running and (name not in catalog or catalog[name].options != inst.entry.options)]
        for name in changed:
            log.info("(reload) unloading model name=%s (source updated or removed)", name)
            self._request_stop(self.instances[name])
        while any(self.instances[name].running for name in changed):
            await self._wait_change(POLL_S)
        for name in list(self.instances):
            inst = self.instances[name]
            if name not in catalog and inst.entry.source == ADDED:
                continue  # added by POST /models: no source file names it
            if name not in catalog:
                del self.instances[name]
            elif not inst.running:
                inst.entry, inst.exit_code = catalog[name], 0
                self._set_argv(inst, 0)
        for name, entry in catalog.items():
            if name not in self.instances:
                inst = self.instances[name] = Instance(entry)
                self._set_argv(inst, 0)
        self.broadcast("models_reload", "*")
        self._notify()

    async def load_startup_models(self) -> None:
        for inst in list(self.instances.values()):
            if inst.entry.load_on_startup:
                await self.load(inst.name)

    async def ensure_ready(self, name: str, cancelled) -> bool:
        """Wait until the model serves (loading it, through the queue, if it must); False when it
        was ready already. ``cancelled()`` (awaitable) ends the wait for a client that left."""
        inst = self.instances[name]
        if not inst.stopping and inst.ready_or_sleep:
            return False
        if inst.status == "downloading":  # as upstream, a request does not wait for a download
            raise RouterError(f"model name={name} is still downloading; try again once it is listed as unloaded",
                              503, "unavailable_error")
        queued = did_load = saw_loading = False
        if inst.status == "unloaded":
            self._join(name)
            self._tick()
            queued = True
        log.info("waiting until model name=%s is fully loaded...", name)
        try:
            while True:
                inst = self.instances.get(name)
                if inst is None:
                    break
                if inst.stopping:  # a stopping instance takes no request: the next one serves it
                    if not queued:
                        self._join(name)
                        self._tick()
                        queued = True
                    if await cancelled():
                        raise RouterError(f"request cancelled while waiting for model name={name}")
                    await self._wait_change(0.2)
                    continue
                status = inst.status
                if status in ("loaded", "sleeping"):
                    break
                if status == "loading":
                    saw_loading = True
                elif status == "unloaded":
                    if did_load or saw_loading:
                        if inst.failed:
                            raise RouterError(f"model name={name} failed to load", 500, "server_error")
                        break
                    if not queued:
                        break
                if await cancelled():
                    raise RouterError(f"request cancelled while waiting for model name={name}")
                if status == "unloaded" and self._try_claim(name):
                    ok = True
                    try:
                        log.info("slot available, loading queued model name=%s", name)
                        await self.load(name)
                        did_load = True
                    except RouterError as exc:
                        log.warning("queued load of name=%s did not go through: %s", name, exc)
                        ok = False
                    self._claim_done(name, ok)
                    self._tick()
                    continue
                await self._wait_change(0.2)
        except BaseException:
            if queued:
                self._leave(name)
            self._tick()
            raise
        if queued:
            self._leave(name)
        return True

    # -- requests ------------------------------------------------------------------------------------
    def begin_request(self, inst: Instance, update_last_used: bool) -> None:
        """Count a request the child is about to serve (``end_request`` when its answer is done)."""
        if not inst.running:
            raise RouterError(f"model name={inst.name} is not running")
        if update_last_used:
            inst.last_used = time.monotonic()
        inst.req_count += 1

    def end_request(self, inst: Instance) -> None:
        if inst.req_count > 0:
            inst.req_count -= 1
            if inst.req_count == 0:
                self._tick()
                self._notify()
