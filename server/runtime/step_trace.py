"""An opt-in trace of the engine's iterations, for finding where a server's wall time goes.

``MLXCEL_TRACE_STEPS=PATH`` makes the scheduler append one JSON object a line to ``PATH`` for every
ragged step it runs: when it started and ended (``time.perf_counter`` seconds, so the gaps between
steps are what the engine did besides stepping), whether it was pipelined, the rows in the
forward and how many of them verified drafts, prefilled a prompt chunk or decoded one token, the
tokens the forward carried, the drafts in it and those accepted, and how long the forward itself
took to evaluate (only where the step waits for it). ``scripts/trace_steps.py`` summarizes a trace.
Off (unset), the scheduler pays one attribute test a step.
"""

from __future__ import annotations

import json
import threading
import time

from mlxcel.engine.platform.settings import settings


class StepTrace:
    """Appends one line per step to the file named by ``MLXCEL_TRACE_STEPS`` (nothing when unset)."""

    def __init__(self, path: str | None = None):
        path = (settings().trace_steps or "") if path is None else path
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (kept open while serving)
        self._lock = threading.Lock()

    @property
    def on(self) -> bool:
        return self._file is not None

    def record(self, **fields) -> None:
        if self._file is None:
            return
        fields.setdefault("t_end", time.perf_counter())
        line = json.dumps(fields, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
