"""``POST /models``: a model added to the router by its Hugging Face repository, as upstream's router
adds one. The body is upstream's, ``{"model": "<user>/<model>[:quant]"}``, and the name is the
model's id from then on.

The files are chosen before the answer (a repository or quant that does not exist is a 400 listing
what the repository has; a hub that cannot be reached, 503), so ``{"success": true}`` means the
model is in ``GET /models``: ``downloading`` while its files come into the Hugging Face cache
(``download_progress`` events on ``/models/sse``, at most two a second, bytes per file), then
``unloaded`` (``download_finished``), loadable as any other; a failed download removes it again
(``download_failed``, with the reason). Files the cache already holds are not fetched, and with
``HF_HUB_OFFLINE=1`` nothing is.

The download runs in the router's process, on a daemon thread, so a router that stops does not wait
for it; the model's child server then loads it from the cache with ``--hf-repo <name>``. Unlike
upstream, a download cannot be cancelled (``/models/unload`` answers that the model is not running)
and the model is not removable (``DELETE /models``), and what was added is listed until the router
stops: the router does not list the whole Hugging Face cache as upstream's does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model import hub
from mlxcel.engine.model.hub_select import split_repo_tag
from mlxcel.server.router.catalog import ModelEntry
from mlxcel.server.router.models import ADDED, Models, RouterError

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.5


async def add_model(models: Models, name: str) -> None:
    """Validate ``name``, choose its files, list it as ``downloading`` and start the download."""
    try:
        split_repo_tag(name)
    except ModelLoadError as exc:
        raise RouterError(str(exc)) from None
    if models.find(name) is not None:
        raise RouterError(f"model '{name}' already exists")
    try:
        hub_plan = await _on_daemon_thread(hub.plan, name)
    except hub.HubUnreachableError as exc:
        raise RouterError(str(exc), 503, "unavailable_error") from None
    except ModelLoadError as exc:
        raise RouterError(str(exc)) from None
    if models.find(name) is not None:  # another request added it while the files were chosen
        raise RouterError(f"model '{name}' already exists")
    log.info("starting download for model '%s' (%s)", name, ", ".join(hub_plan.choice.files))
    models.add(ModelEntry(name, ADDED, {"hf-repo": name}), status="downloading")
    models.background(_download(models, name, hub_plan))


async def _download(models: Models, name: str, hub_plan: hub.HubPlan) -> None:
    reporter = _Reporter(lambda data: models.broadcast("download_progress", name, data), asyncio.get_running_loop())
    try:
        result = await _on_daemon_thread(hub.fetch, hub_plan, reporter)
    except Exception as exc:  # ModelLoadError, or anything the hub client raised on its thread
        log.error("download failed for model name=%s: %s", name, exc)
        models.discard(name)
        models.broadcast("download_failed", name, {"message": str(exc)})
        return
    log.info("download finished for model name=%s: %s", name, result.path)
    models.broadcast("download_finished", name, {})
    models.downloaded(name)


class _Reporter:
    """``hub.Progress`` called on the download thread: forwards each file's bytes to the event loop,
    at most every ``PROGRESS_INTERVAL_S`` (and always when a file completes)."""

    def __init__(self, emit: Callable[[dict], None], loop: asyncio.AbstractEventLoop):
        self.emit, self.loop = emit, loop
        self.files: dict[str, dict[str, Any]] = {}
        self.last = 0.0
        self.lock = threading.Lock()

    def __call__(self, file: str, done: int, total: int | None) -> None:
        with self.lock:
            self.files[file] = {"done": done, "total": total}
            now = time.monotonic()
            if now - self.last < PROGRESS_INTERVAL_S and done != total:
                return
            self.last = now
            data = {"progress": {f: dict(v) for f, v in self.files.items()}}
        try:
            self.loop.call_soon_threadsafe(self.emit, data)
        except RuntimeError:  # the loop closed: the router is stopping
            pass


def _on_daemon_thread(fn: Callable, *args) -> asyncio.Future:
    """``fn(*args)`` on a daemon thread (a download must not hold a stopping router open)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def run() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop closed while the thread ran
            pass

    threading.Thread(target=run, name="mlxcel-download", daemon=True).start()
    return future
