"""Driving a test server from several clients at once, and reading one figure of its /metrics."""

from __future__ import annotations

import asyncio

import httpx


def metric(url: str, name: str) -> float:
    """The value of an unlabelled metric (0 when the server does not show it)."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def concurrently(url: str, bodies: list[dict]) -> list[dict]:
    """Every body POSTed to /completion at the same time; the answers in the bodies' order."""
    async def run():
        async with httpx.AsyncClient() as client:
            async def one(b):
                r = await client.post(url + "/completion", json=b, timeout=180)
                assert r.status_code == 200, r.text
                return r.json()
            return await asyncio.gather(*(one(b) for b in bodies))

    return asyncio.run(run())
