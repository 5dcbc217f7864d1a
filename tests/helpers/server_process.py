"""Run mlxcel-server as a real process on 127.0.0.1 for the server tests, and read the upstream
captures those tests compare against."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from captures import CAPTURES

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env() -> dict:
    """This process's environment, with OpenBLAS preloaded for the server on a Linux CPU."""
    from mlxcel.engine.platform.device import env_with_fast_blas

    return env_with_fast_blas()


class ServerProcess:
    """``python -m mlxcel.server.cli ARGS --port P``, waited for until /health is 200 (``launcher``:
    the command that starts it, e.g. ``mlx.launch -n 2 --``)."""

    def __init__(self, *args: str, timeout: float = 180.0, env: dict | None = None, port: int | None = None,
                 launcher: tuple[str, ...] = ()):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [*launcher, sys.executable, "-m", "mlxcel.server.cli", *args, "--host", "127.0.0.1",
               "--port", str(self.port)]
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"mlxcel-server-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env={**server_env(), **(env or {})}, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not become healthy:\n{self.log()}")
            time.sleep(0.2)

    def rss_kib(self) -> int:
        """The server's resident memory now, from ``/proc/<pid>/status`` (Linux)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS line")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def run_server_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m mlxcel.server.cli ARGS`` run to its exit, output captured as text (for
    command lines that must be refused, or that print and exit)."""
    return subprocess.run([sys.executable, "-m", "mlxcel.server.cli", *args], cwd=REPO, env=server_env(),
                          capture_output=True, text=True, timeout=timeout)


@dataclass
class Capture:
    name: str
    method: str
    path: str
    body: bytes | None
    status: int
    headers: dict[str, str]
    response: str

    def json(self):
        return json.loads(self.response)

    def events(self) -> list[str]:
        return sse_events(self.response)


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (checking the framing as it goes)."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), f"bad SSE block: {block[:80]!r}"
        out.append(block[len("data: "):])
    return out


def load_capture(name: str) -> Capture:
    req = (CAPTURES / "responses" / f"{name}.request.txt").read_text()
    first, _, body = req.partition("\n")
    method, path = first.split()[:2]
    raw = (CAPTURES / "responses" / f"{name}.txt").read_text()
    head, _, payload = raw.partition("\n\n")
    lines = head.splitlines()
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return Capture(name, method, path, body.encode() if body.strip() else None, status, headers, payload)


def capture_names() -> list[str]:
    return sorted(p.name[: -len(".request.txt")] for p in (CAPTURES / "responses").glob("*.request.txt"))


@contextmanager
def running(**makers: Callable[[], ServerProcess]) -> Iterator[dict[str, ServerProcess]]:
    """Start one server per keyword (``name=functools.partial(ServerProcess, *args)``), yield
    them by name, and stop every one that started, whatever happens."""
    procs: dict[str, ServerProcess] = {}
    try:
        for name, make in makers.items():
            procs[name] = make()
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def post_ok(server: ServerProcess, path: str, body: dict, timeout: float = 180) -> dict:
    """POST ``body`` as JSON, require 200, return the decoded body."""
    r = httpx.post(server.url + path, json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()
