"""Cost of the server's request gate (CORS header, loading check, API key check, body limit) per
request: the gate around a do-nothing ASGI app against the bare app, in the same run.

    ./scripts/with-blas .venv/bin/python scripts/bench_gate.py [--n 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from mlxcel.server.http.gate.middleware import GateMiddleware
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.config import ServerConfig


async def bare(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def run(app, n: int, headers) -> float:
    scope = {"type": "http", "method": "POST", "path": "/completion", "headers": headers}

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(_message):
        return None

    t0 = time.perf_counter()
    for _ in range(n):
        await app(scope, receive, send)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    n = ap.parse_args().n
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", b"2"),
               (b"origin", b"http://ui.example"), (b"authorization", b"Bearer k2")]
    state = ServerState(config=ServerConfig(api_key="k1,k2"))
    state.api_keys = state.config.api_keys()
    state.scheduler = object()  # "ready": the gate only asks whether one exists
    gate = GateMiddleware(bare, state)
    for label, app in (("bare app", bare), ("gate + app", gate), ("bare app", bare), ("gate + app", gate)):
        per = asyncio.run(run(app, n, headers))
        print(f"{label:>11}: {per * 1e6:.2f} us/request")


if __name__ == "__main__":
    main()
