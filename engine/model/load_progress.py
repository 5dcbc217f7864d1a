"""A progress line in the log while a GGUF's tensors are read and converted, so a load that takes
minutes does not look hung: the share of tensors done, at most one line a second, and a last line
with the time it took. A file of at least ``MLXCEL_LOAD_PROGRESS_MIN_MB`` MiB (default 1024; 0 for
every file) reports at the info level; a smaller one, which loads in a blink, at the debug level
only (``-v`` shows it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from mlxcel.engine.platform.settings import settings

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
T = TypeVar("T")


def min_bytes() -> int:
    """The size from which a load reports at the info level (``MLXCEL_LOAD_PROGRESS_MIN_MB``)."""
    return int(settings().load_progress_min_mb * 2**20)


def tracked(items: Sequence[T], path: Path, *, threshold: int | None = None, interval: float = INTERVAL_S,
            clock: Callable[[], float] = time.monotonic) -> Iterator[T]:
    """``items`` (one per tensor), logging how many are done at most once per ``interval`` seconds,
    and once at the end: at the info level when ``path`` is at least ``threshold`` bytes (default:
    :func:`min_bytes`), else at the debug level."""
    size = path.stat().st_size if path.exists() else 0
    level = logging.INFO if size >= (min_bytes() if threshold is None else threshold) else logging.DEBUG
    if not items or not log.isEnabledFor(level):
        yield from items
        return
    total = len(items)
    start = last = clock()
    log.log(level, "%s: loading %d tensors from %.1f MiB", path.name, total, size / 2**20)
    for done, item in enumerate(items, start=1):
        yield item
        now = clock()
        if done < total and now - last >= interval:
            log.log(level, "%s: loaded %d%% of tensors (%d/%d, %.1f s)", path.name, 100 * done // total, done, total,
                    now - start)
            last = now
    log.log(level, "%s: loaded 100%% of tensors (%d/%d, %.1f s)", path.name, total, total, clock() - start)
