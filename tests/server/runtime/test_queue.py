"""A full queue answers 503 upstream-style at once, and the server keeps serving."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from server_process import ServerProcess


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "1", env={"MLXCEL_MAX_QUEUE": "1"})
    yield proc
    proc.stop()


def _busy(server) -> bool:
    return any(s["is_processing"] for s in httpx.get(server.url + "/slots", timeout=10).json())


def test_full_queue_is_503_and_the_server_recovers(server):
    long_body = {"prompt": "one two three", "n_predict": 2000, "ignore_eos": True, "temperature": 0}
    results = {}

    def run(name):
        results[name] = httpx.post(server.url + "/completion", json=long_body, timeout=120)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    deadline = time.monotonic() + 30
    while not _busy(server):  # the only slot is taken
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    time.sleep(0.5)  # the second request now waits in the queue (capacity 1)

    r = httpx.post(server.url + "/completion", json={"prompt": "hi", "n_predict": 2}, timeout=30)
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "unavailable_error" and r.json()["error"]["code"] == 503

    first.join(120)
    second.join(120)
    assert results["first"].status_code == 200 and results["second"].status_code == 200
    assert results["second"].json()["tokens_predicted"] == 2000
    ok = httpx.post(server.url + "/completion", json={"prompt": "hi", "n_predict": 2}, timeout=30)
    assert ok.status_code == 200
