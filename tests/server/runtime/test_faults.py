"""Faults on a real server: an exception inside the engine step fails only the requests that step
touched (error body, or error event on a stream) and the engine keeps serving; a request past
``--timeout`` ends with an error and frees its slot; SIGTERM ends in-flight streams cleanly and the
process exits 0.

Engine faults are real exceptions raised on the engine thread by ``MLXCEL_FAULT_INJECT`` (see
``server/runtime/faults.py``) for requests whose prompt carries a marker; what is asserted is the
scheduler's own handling of them.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import pytest
from server_process import ServerProcess, sse_events

FAULTS = "sample:fault-at-sample,forward:fault-at-forward,prefill:fault-at-prefill"
LONG = 800


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    # -c 4096: 1024 per slot, room for LONG tokens (the context is split among the slots)
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "4", "-c", "4096", env={"MLXCEL_FAULT_INJECT": FAULTS})
    yield proc
    proc.stop()


def post(server, body: dict, path: str = "/completion") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def stream_events(server, body: dict, path: str = "/completion", on_first=None) -> list[dict | str]:
    """Every ``data:`` payload of a stream, decoded (``[DONE]`` kept as the string). Raises if the
    stream does not end cleanly (a cut connection is an httpx error)."""
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        text = ""
        for chunk in r.iter_text():
            text += chunk
            if on_first is not None and "data: " in text:
                on_first()
                on_first = None
    return [p if p == "[DONE]" else json.loads(p) for p in sse_events(text)]


def idle(server) -> bool:
    return all(not s["is_processing"] for s in httpx.get(server.url + "/slots", timeout=10).json())


def wait_idle(server, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not idle(server):
        assert time.monotonic() < deadline, "slots stayed busy"
        time.sleep(0.05)


def wait_busy(server, n: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while sum(s["is_processing"] for s in httpx.get(server.url + "/slots", timeout=10).json()) < n:
        assert time.monotonic() < deadline, "requests did not start"
        time.sleep(0.02)


def in_threads(*calls):
    """Run each ``(name, fn)`` in a thread; return ``{name: result or exception}`` and the starters."""
    results: dict = {}

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as exc:  # reported, asserted by the caller
            results[name] = exc

    threads = [threading.Thread(target=run, args=c) for c in calls]
    return results, threads


def long_body(prompt: str = "the quiet river") -> dict:
    return {"prompt": prompt, "n_predict": LONG, "ignore_eos": True, "temperature": 0}


def assert_server_error(r: httpx.Response) -> None:
    assert r.status_code == 500, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == 500 and "InjectedFault" in err["message"]


@pytest.mark.parametrize("stage", ["sample", "prefill"])
def test_a_fault_in_one_row_fails_only_that_request(server, stage):
    results, threads = in_threads(
        ("a", lambda: post(server, long_body("alpha river"))),
        ("b", lambda: post(server, long_body("beta river"))),
    )
    for t in threads:
        t.start()
    wait_busy(server, 2)
    marked = {"prompt": f"x fault-at-{stage} y", "n_predict": LONG, "ignore_eos": True}
    assert_server_error(post(server, marked))
    events = stream_events(server, marked)
    assert events[-1]["error"]["type"] == "server_error" and "InjectedFault" in events[-1]["error"]["message"]
    for t in threads:
        t.join(120)
    for name in ("a", "b"):  # the rows beside it ran to the end
        r = results[name]
        assert r.status_code == 200 and r.json()["tokens_predicted"] == LONG, r
    wait_idle(server)
    assert post(server, {"prompt": "after", "n_predict": 3, "ignore_eos": True}).json()["tokens_predicted"] == 3


def test_a_fault_in_the_batched_forward_fails_its_rows_and_the_engine_goes_on(server):
    results, threads = in_threads(("a", lambda: post(server, long_body("gamma river"))))
    threads[0].start()
    wait_busy(server, 1)
    # the marked row joins the decode batch; the forward it shares with "a" raises
    assert_server_error(post(server, {"prompt": "fault-at-forward", "n_predict": LONG, "ignore_eos": True}))
    threads[0].join(120)
    r = results["a"]
    assert r.status_code in (200, 500)
    if r.status_code == 500:  # it was in that forward: failed with the same error, not left hanging
        assert_server_error(r)
    wait_idle(server)
    # the engine keeps serving, batched rows included
    later, threads = in_threads(*[(i, lambda i=i: post(server, {"prompt": f"row {i}", "n_predict": 20,
                                                                "ignore_eos": True})) for i in range(3)])
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(later[i].status_code == 200 and later[i].json()["tokens_predicted"] == 20 for i in range(3))
    wait_idle(server)


def test_a_request_past_the_timeout_ends_with_an_error_and_frees_its_slot(tiny_llama_dir):
    # --context-shift: the tiny model fills its context in under a second, and without a shift that ends the
    # "endless" requests with a 200 before the timeout can
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "2", "--timeout", "1", "--context-shift")
    try:
        endless = {"prompt": "on and on", "n_predict": -1, "ignore_eos": True}
        results, threads = in_threads(
            ("plain", lambda: post(proc, endless)),
            ("plain2", lambda: post(proc, endless)),
            ("queued", lambda: post(proc, endless)),  # waits for a slot, and times out there
            ("stream", lambda: stream_events(proc, endless)),
        )
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - t0
        for name in ("plain", "plain2", "queued"):
            r = results[name]
            assert r.status_code == 503, r.text[:300]
            err = r.json()["error"]
            assert err["type"] == "unavailable_error" and "--timeout" in err["message"]
        events = results["stream"]
        assert isinstance(events, list), events
        assert events[-1]["error"]["type"] == "unavailable_error" and "--timeout" in events[-1]["error"]["message"]
        assert elapsed < 20
        wait_idle(proc)
        r = post(proc, {"prompt": "short", "n_predict": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
        # a body that stalls is a read timeout (upstream's meaning of --timeout): 408
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as sock:
            sock.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": \"st")
            reply = b""
            while chunk := sock.recv(65536):  # the server closes the connection after the error
                reply += chunk
            reply = reply.decode()
        assert reply.startswith("HTTP/1.1 408"), reply[:200]
        body = json.loads(reply.partition("\r\n\r\n")[2])
        assert body["error"]["code"] == 408 and body["error"]["type"] == "invalid_request_error"
        assert post(proc, {"prompt": "short", "n_predict": 2}).status_code == 200
    finally:
        proc.stop()


def test_sigterm_ends_streams_cleanly_and_exits_0(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "4", "--context-shift")  # endless: no context end
    try:
        started = threading.Semaphore(0)
        endless = {"prompt": "keep going", "n_predict": -1, "ignore_eos": True}
        streams, threads = in_threads(*[(i, lambda: stream_events(proc, endless, on_first=started.release))
                                        for i in range(3)])
        chat, chat_threads = in_threads(("chat", lambda: stream_events(
            proc, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1, "ignore_eos": True},
            path="/v1/chat/completions", on_first=started.release)))
        for t in threads + chat_threads:
            t.start()
        for _ in range(4):
            assert started.acquire(timeout=60)
        proc.proc.send_signal(signal.SIGTERM)
        for t in threads + chat_threads:
            t.join(60)
        assert proc.proc.wait(timeout=60) == 0, proc.log()
        for events in [streams[i] for i in range(3)] + [chat["chat"]]:
            assert not isinstance(events, Exception), events  # the stream ended cleanly, not cut
            last = events[-1]
            assert last["error"]["type"] == "unavailable_error" and "shutting down" in last["error"]["message"]
        with pytest.raises(httpx.ConnectError):
            httpx.get(proc.url + "/health", timeout=5)
    finally:
        proc.stop()
