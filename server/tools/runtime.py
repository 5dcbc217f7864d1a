"""``--tools-runtime``: the isolate every tool call runs in unless its ``x-tool-runtime`` header
names another. ``<engine>:<image>`` (docker or podman) spawns a container at startup and owns it
(``run --rm -i <image> sh``, kept alive by its open stdin, respawned if it dies, stopped with the
server); any other spec (``<engine>-container:<id>``, ``ssh:<target>``) names an existing target
and is only checked at startup."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time

from mlxcel.server.tools.io import ToolRuntimeError, make_io, parse_container_spec

log = logging.getLogger(__name__)


class StaticRuntime:
    def __init__(self, spec: str):
        self._spec = spec

    def spec(self) -> str:
        return self._spec

    def close(self) -> None:
        pass


class ContainerRuntime:
    def __init__(self, engine: str, image: str):
        if not image:
            raise ToolRuntimeError(f"--tools-runtime {engine}:<image> requires an image name")
        self.engine, self.image = engine, image
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self.container_id = ""
        self._spawn()

    def _spawn(self) -> None:
        cidfile = os.path.join(tempfile.gettempdir(), f"mlxcel-tools-runtime-cid-{os.getpid()}-{time.monotonic_ns()}")
        try:
            self._proc = subprocess.Popen([self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh"],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as exc:
            raise ToolRuntimeError(f"failed to spawn {self.engine} container for tools runtime (image: {self.image}): "
                                   f"{exc}") from None
        cid = ""
        for _ in range(100):
            try:
                with open(cidfile, encoding="utf-8") as f:
                    cid = f.readline().strip()
            except OSError:
                pass
            if cid or self._proc.poll() is not None:
                break
            time.sleep(0.1)
        try:
            os.unlink(cidfile)
        except OSError:
            pass
        if not cid:
            self._proc.kill()
            raise ToolRuntimeError(f"timed out waiting for {self.engine} container to start (image: {self.image})")
        self.container_id = cid

    def spec(self) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                log.warning("%s tools runtime container %r died, respawning", self.engine, self.container_id)
                self._spawn()
            return f"{self.engine}-container:{self.container_id}"

    def close(self) -> None:
        """Close the shell's stdin: it exits, and ``--rm`` removes the container."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()


def make_runtime(spec: str) -> StaticRuntime | ContainerRuntime:
    """The runtime ``--tools-runtime SPEC`` names; a bad spec raises ``ToolRuntimeError`` at startup."""
    parsed = parse_container_spec(spec)
    if parsed is not None and not parsed[2]:
        return ContainerRuntime(parsed[0], parsed[1])
    make_io({"runtime": spec})  # nothing to own: only refuse a bad spec now
    return StaticRuntime(spec)
