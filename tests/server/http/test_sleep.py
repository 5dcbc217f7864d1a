"""``--sleep-idle-seconds``, against a real server: the model is unloaded after the idle time,
upstream's read-only routes answer from the snapshot without waking it, anything that uses the
model wakes it and is served, and the throughput window of ``/metrics`` is reported once."""

from __future__ import annotations

import time

import httpx
import pytest
from server_process import ServerProcess, run_server_command


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", "256", "-np", "1", "--metrics", "--sleep-idle-seconds", "1",
                         "--tools", "read_file")
    yield proc
    proc.stop()


def props(server) -> dict:
    r = httpx.get(server.url + "/props", timeout=30)
    assert r.status_code == 200
    return r.json()


def wait_asleep(server, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not props(server)["is_sleeping"]:
        assert time.monotonic() < deadline, "the server did not go to sleep"
        time.sleep(0.1)


def gauge(server, name: str) -> float:
    r = httpx.get(server.url + "/metrics", timeout=30)
    assert r.status_code == 200
    line = next(ln for ln in r.text.splitlines() if ln.startswith(f"llamacpp:{name} "))
    return float(line.split()[1])


def test_sleeps_and_wakes_on_a_completion(server):
    awake = props(server)
    wait_asleep(server)
    # the read-only routes answer from the snapshot, and neither they nor model-free routes wake it
    for path in ("/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/nope"):
        assert httpx.get(server.url + path, timeout=30).status_code in (200, 404)
    assert httpx.get(server.url + "/tools", timeout=30).status_code == 200
    asleep = props(server)
    assert asleep["is_sleeping"] is True
    assert {k: v for k, v in asleep.items() if k != "is_sleeping"} == \
        {k: v for k, v in awake.items() if k != "is_sleeping"}
    assert httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"] == awake["model_alias"]
    r = httpx.post(server.url + "/completion", json={"prompt": "Hello", "n_predict": 3}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] == 3
    assert props(server)["is_sleeping"] is False


def test_metrics_window_is_reported_once(server):
    r = httpx.post(server.url + "/completion", json={"prompt": "Hello", "n_predict": 8, "ignore_eos": True},
                   timeout=120)
    assert r.status_code == 200, r.text
    wait_asleep(server)
    assert gauge(server, "predicted_tokens_seconds") > 0  # the window from before sleeping
    assert gauge(server, "predicted_tokens_seconds") == 0  # nothing ran since
    assert gauge(server, "tokens_predicted_total") >= 8  # the counters stay
    assert props(server)["is_sleeping"] is True  # scraping does not wake it
    r = httpx.post(server.url + "/tokenize", json={"content": "Hello"}, timeout=120)
    assert r.status_code == 200 and r.json()["tokens"]
    assert props(server)["is_sleeping"] is False
    assert gauge(server, "predicted_tokens_seconds") == 0  # waking does not report the window again


def test_requests_in_flight_keep_it_awake(server):
    wait_asleep(server)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 2})
        assert r.status_code == 200, r.text
        # a request every half second for longer than the idle time: no sleep in between
        for _ in range(4):
            assert client.post("/tokenize", json={"content": "x"}).status_code == 200
            assert props(server)["is_sleeping"] is False
            time.sleep(0.5)


def test_zero_is_refused():
    done = run_server_command("--sleep-idle-seconds", "0", timeout=60)
    assert done.returncode != 0
    assert "cannot be 0 or less than -1" in done.stderr + done.stdout
