"""The LoRA adapters a model was loaded with, and the scales they run at.

As llama-server: adapters are numbered in command-line order from 0; each has a global scale
(``--lora``: 1, ``--lora-scaled FILE:S``: S, ``--lora-init-without-apply``: 0) that
``POST /lora-adapters`` replaces (an adapter the body does not list goes to 0); a request that
lists adapters (``lora: [{"id", "scale"}]``) runs with those scales and 0 for the others, one that
lists none with the global ones as they are when it starts. A row's scales are a tuple with one
entry per adapter; two rows with the same tuple run the same model.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterInfo:
    """What ``GET /lora-adapters`` shows of one adapter besides its id and scale."""

    path: str  # as given on the command line
    task_name: str = ""  # GGUF adapter.lora.task_name
    prompt_prefix: str = ""  # GGUF adapter.lora.prompt_prefix


class AdapterSet:
    """The loaded adapters' descriptions and global scales. The scales are read on the engine thread
    and replaced from the HTTP side: one tuple swapped under a lock, never edited in place."""

    def __init__(self, infos: list[AdapterInfo], scales: tuple[float, ...]):
        if len(infos) != len(scales):
            raise ValueError("one scale per adapter")
        self.infos = list(infos)
        self._scales = tuple(float(s) for s in scales)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.infos)

    @property
    def scales(self) -> tuple[float, ...]:
        return self._scales

    def set_scales(self, listed: Mapping[int, float]) -> None:
        """``POST /lora-adapters``: the listed adapters at their scales, the others at 0 (ids checked
        by the caller)."""
        with self._lock:
            self._scales = self.listed(listed)

    def listed(self, listed: Mapping[int, float]) -> tuple[float, ...]:
        """Scales with the ``listed`` adapters at theirs and every other one at 0."""
        return tuple(float(listed.get(i, 0.0)) for i in range(len(self.infos)))

    def for_request(self, listed: Mapping[int, float] | None) -> tuple[float, ...]:
        """The scales a request runs with: the ones it lists (others 0), or the global ones."""
        return self.listed(listed) if listed else self._scales

    def describe(self) -> list[dict]:
        """``GET /lora-adapters``'s body."""
        return [{"id": i, "path": info.path, "scale": scale, "task_name": info.task_name,
                 "prompt_prefix": info.prompt_prefix} for i, (info, scale) in enumerate(zip(self.infos, self._scales))]


def request_scales(adapters: AdapterSet | None, listed: Mapping[int, float] | None) -> tuple[float, ...]:
    """A request's scales on a model with ``adapters`` (none: ``()``)."""
    return adapters.for_request(listed) if adapters is not None else ()
