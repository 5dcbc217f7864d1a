"""mlxcel-server under ``mlx.launch`` (ring backend on 127.0.0.1): N ranks, one HTTP server."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

from server_process import ServerProcess, free_port

MLX_LAUNCH = str(Path(sys.executable).with_name("mlx.launch"))


def launcher(n: int = 2) -> tuple[str, ...]:
    # the ring listens on ports from -p upwards (one per rank): a free one, clear of other servers
    return (MLX_LAUNCH, "-n", str(n), "--backend", "ring", "-p", str(free_port()), "--")


def distributed_server(*args: str, n: int = 2, **kw) -> ServerProcess:
    return ServerProcess(*args, launcher=launcher(n), **kw)


def rank_pids(server: ServerProcess) -> dict[int, int]:
    """Each rank's pid, from the lines the ranks log at startup (run with -v)."""
    text = server.log_path.read_text(errors="replace")
    return {int(r): int(p) for r, p in re.findall(r"distributed: rank (\d+) of \d+, pid (\d+)", text)}


def stop_all(server: ServerProcess) -> None:
    """Stop the launcher and make sure no rank outlives it."""
    pids = rank_pids(server)
    server.stop()
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
