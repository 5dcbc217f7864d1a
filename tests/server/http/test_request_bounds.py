"""No one client can hold the server: every request and connection is bounded, on a real server
with a short ``--timeout`` (3 s) and a per-address limit of 8 connections.

- an embedding request past ``--timeout`` ends with 503, as a completion does, and the engine
  stops computing its inputs;
- headers or a body dripped a byte at a time, and a connection that sends nothing, are cut off
  (before, each was held for as long as the client liked);
- a ninth connection from one address is refused with 503, and served again once one closes;
- a client that hangs up on a non-streamed request leaves one log line, not a traceback.

The deadlines here are 3 s; the tests allow ten times that before calling a connection held.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess

TIMEOUT_S = 3
PER_IP = 8
HELD_S = 30  # a connection still open this long after its deadline was not cut off


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "--embeddings", "--pooling", "last", "-np", "2",
                         "--timeout", str(TIMEOUT_S), "--context-shift", env={"MLXCEL_MAX_CONNECTIONS_PER_IP": str(PER_IP)})
    yield proc
    proc.stop()


def _log(server) -> str:
    return Path(server.log_path).read_text(errors="replace")


def _wait_for_log(server, text: str, within: float = 20) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        log = _log(server)
        if text in log:
            return log
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in the server's log:\n{_log(server)[-3000:]}")


def test_an_embedding_request_past_the_timeout_ends_and_its_work_stops(server):
    # 5000 inputs of 200 tokens: many times --timeout of engine work (token ids: nothing to tokenize)
    inputs = [[5 + (i + j) % 300 for j in range(200)] for i in range(5000)]
    r = httpx.post(server.url + "/embedding", json={"content": inputs}, timeout=300)
    assert r.status_code == 503, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "unavailable_error" and "--timeout" in err["message"]
    # the engine stopped with inputs left, instead of computing all of them for nobody
    log = _wait_for_log(server, "embedding request ended after")
    line = log[log.index("embedding request ended after"):].splitlines()[0]
    done, total = (int(x) for x in line.split("after ")[1].split(" inputs")[0].split(" of "))
    assert total == 5000 and done < total, line
    ok = httpx.post(server.url + "/completion", json={"prompt": "hi", "n_predict": 1}, timeout=60)
    assert ok.status_code == 200


def _drip(port: int, head: bytes, drip: bytes, every_s: float = 0.2) -> tuple[float, bytes]:
    """Send ``head``, then ``drip`` a byte every ``every_s`` seconds, until the server answers or
    closes (or HELD_S passes); return how long the connection was held and what came back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(every_s)
        sock.sendall(head)
        t0 = time.monotonic()
        reply, i = b"", 0
        while time.monotonic() - t0 < HELD_S:
            try:
                if i < len(drip):
                    sock.sendall(drip[i:i + 1])
                    i += 1
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # reset: the server closed with bytes unread
                break
            if not chunk:
                break
            reply += chunk
        return time.monotonic() - t0, reply


def _error(reply: bytes) -> dict:
    return json.loads(reply.partition(b"\r\n\r\n")[2])["error"]


def test_headers_dripped_a_byte_at_a_time_are_cut_off(server):
    held, reply = _drip(server.port, b"POST /completion HTTP/1.1\r\n",
                        b"Host: x\r\nX-Slow: " + b"a" * 1000 + b"\r\n\r\n")
    assert held < HELD_S - 5, f"held {held:.1f} s"
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert _error(reply)["type"] == "invalid_request_error"


def test_a_connection_that_sends_nothing_is_closed(server):
    held, reply = _drip(server.port, b"", b"")
    assert held < HELD_S - 5 and reply == b"", (held, reply[:200])


def test_a_body_dripped_a_byte_at_a_time_is_cut_off_as_a_whole(server):
    # a byte every 0.2 s never stalls for --timeout, but the whole body must arrive within it
    head = (b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    held, reply = _drip(server.port, head, b"{" + b" " * 999)
    assert held < HELD_S - 5, f"held {held:.1f} s"
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert "did not arrive whole" in _error(reply)["message"]


def _get_health(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    return reply


def _length(reply: bytes) -> int:
    for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _connect(source: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_one_address_holds_at_most_the_limit_of_connections(server):
    held = [_connect(port=server.port) for _ in range(PER_IP)]
    try:
        assert all(_get_health(s).startswith(b"HTTP/1.1 200") for s in held)  # kept alive, all 8
        extra = _connect(port=server.port)
        reply = _get_health(extra)
        extra.close()
        assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
        assert "too many connections" in _error(reply)["message"]
        try:  # another loopback address is another client (Linux routes all of 127/8 to lo)
            other = _connect("127.0.0.2", server.port)
        except OSError:
            other = None
        if other is not None:
            assert _get_health(other).startswith(b"HTTP/1.1 200")
            other.close()
        held.pop().close()
        time.sleep(0.5)  # the server sees the close
        again = _connect(port=server.port)
        assert _get_health(again).startswith(b"HTTP/1.1 200")
        held.append(again)
    finally:
        for s in held:
            s.close()


def test_a_client_that_hangs_up_leaves_one_line_not_a_traceback(server):
    body = json.dumps({"prompt": "once upon a time", "n_predict": 100000, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)  # generating, not streamed
    _wait_for_log(server, "POST /completion: the client disconnected")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # hangs up mid-body
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"input\": ")
        time.sleep(0.3)
    _wait_for_log(server, "POST /v1/embeddings: the client disconnected")
    log = _log(server)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert httpx.post(server.url + "/completion", json={"prompt": "hi", "n_predict": 1}).status_code == 200
