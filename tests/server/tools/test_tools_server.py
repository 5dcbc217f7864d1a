"""``/tools`` and ``/cors-proxy`` on a real server (a router with no models, so that nothing loads):
the built-in tools with their header-only parameters, streamed shell output, upstream's error
bodies and statuses, an MCP server's tools (listed at startup, called, timed out, respawned after
it dies) and the CORS proxy, which forwards only the headers the client names explicitly."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess, run_server_command

MCP_SERVER = str(Path(__file__).resolve().parents[2] / "helpers" / "mcp_stdio_server.py")
KEY = {"Authorization": "Bearer k"}


def mcp_json(timeout_ms: int = 30000) -> str:
    return json.dumps({"mcpServers": {
        "t": {"command": sys.executable, "args": [MCP_SERVER], "timeout_ms": timeout_ms},
        "gone": {"command": "/nonexistent/mcp-server"},
    }})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    empty = tmp_path_factory.mktemp("tools") / "no-models.ini"  # a router with no models: nothing loads
    empty.write_text("; no models\n")
    proc = ServerProcess("--models-preset", str(empty), "--tools", "read_file,write_file,exec_shell_command,"
                         "file_glob_search", "--ui-mcp-proxy", "--mcp-servers-json", mcp_json(timeout_ms=1500),
                         "--api-key", "k", timeout=120)
    yield proc
    proc.stop()


def call(server, tool: str, params: dict, headers: dict | None = None, **body) -> httpx.Response:
    return httpx.post(server.url + "/tools", json={"tool": tool, "params": params, **body},
                      headers={**KEY, **(headers or {})}, timeout=60)


def test_listing_and_file_tools(server, tmp_path):
    listing = httpx.get(server.url + "/tools", headers=KEY, timeout=30).json()
    names = [t["tool"] for t in listing]
    assert names[:4] == ["read_file", "file_glob_search", "exec_shell_command", "write_file"]
    assert {"t_echo", "t_sleep", "t_fail", "t_exit"} <= set(names) and not any(n.startswith("gone_") for n in names)
    echo = next(t for t in listing if t["tool"] == "t_echo")
    assert echo["type"] == "mcp" and echo["definition"]["function"]["parameters"]["required"] == ["text"]
    cwd = {"x-tool-cwd": str(tmp_path)}
    r = call(server, "write_file", {"path": "sub/n.txt", "content": "hello\n", "cwd": "/elsewhere"}, cwd)
    assert r.json()["result"] == "file written successfully" and (tmp_path / "sub" / "n.txt").read_text() == "hello\n"
    assert call(server, "read_file", {"path": "sub/n.txt"}, cwd).json() == {"plain_text_response": "hello\n"}
    found = call(server, "file_glob_search", {"path": ".", "include": "*.txt"}, cwd).json()
    assert found["entries"] == [{"path": "sub/n.txt", "type": "file"}] and found["base"] == str(tmp_path)


def test_shell_streams_and_errors(server, tmp_path):
    with httpx.stream("POST", server.url + "/tools", headers={**KEY, "x-tool-cwd": str(tmp_path)}, timeout=60,
                      json={"tool": "exec_shell_command", "params": {"command": "pwd; echo done"}, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    text = "".join(e.get("chunk", "") for e in events)
    assert str(tmp_path) in text and text.endswith("[exit code: 0]") and events[-1] == {"done": True}
    r = call(server, "nope", {})
    assert r.status_code == 404 and r.json() == {"code": 400, "message": 'unknown tool "nope"',
                                                 "type": "invalid_request_error"}
    assert call(server, "read_file", {}, stream=True).status_code == 404  # cannot stream
    assert call(server, "read_file", {}).status_code == 400  # missing path
    r = call(server, "exec_shell_command", {"command": "echo hi"}, {"x-tool-runtime": "ssh:-oProxyCommand=touch x"})
    assert r.status_code == 500 and "invalid ssh target" in r.json()["message"]
    assert call(server, "get_info", {}).status_code == 404  # not enabled
    assert httpx.post(server.url + "/tools", json={"tool": "read_file"}, timeout=30).status_code == 401


def test_mcp_calls_timeout_and_respawn(server):
    first = call(server, "t_echo", {"text": "hi"}).json()["plain_text_response"]
    assert first.startswith("echo: hi (call 1")
    assert call(server, "t_echo", {"text": "x"}).json()["plain_text_response"].startswith("echo: x (call 2")
    assert call(server, "t_fail", {}).json() == {"error": "it broke"}
    assert call(server, "t_exit", {}).json() == {"error": "transport closed"}
    again = call(server, "t_echo", {"text": "back"}).json()["plain_text_response"]
    assert again.startswith("echo: back (call 1")  # a fresh process
    assert call(server, "t_sleep", {"seconds": 5}).json() == {"error": "request timed out"}  # timeout_ms 1500


class _Target(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.seen = dict(self.headers)
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Access-Control-Allow-Origin", "http://evil.example")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_cors_proxy_forwards_only_named_headers(server):
    target = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{target.server_port}/x?a=1"
        r = httpx.get(server.url + "/cors-proxy", params={"url": url}, timeout=30, headers={
            **KEY, "Cookie": "s=1", "X-Api-Key": "k", "x-llama-server-proxy-header-accept": "text/plain",
            "x-llama-server-proxy-header-authorization": "Bearer remote"})
        assert r.status_code == 200 and r.json() == {"ok": True}
        assert r.headers.get("access-control-allow-origin") != "http://evil.example"
        seen = {k.lower(): v for k, v in target.seen.items()}
        assert seen["accept"] == "text/plain" and seen["authorization"] == "Bearer remote"
        assert "cookie" not in seen and "x-api-key" not in seen
        r = httpx.post(server.url + "/cors-proxy", params={"url": url}, json={}, headers=KEY, timeout=30)
        assert r.status_code == 204 and r.content == b""
        assert httpx.get(server.url + "/cors-proxy", params={"url": "file:///etc/passwd"}, headers=KEY,
                         timeout=30).status_code == 400
        assert httpx.get(server.url + "/props", headers=KEY, timeout=30).json()["cors_proxy_enabled"] is True
    finally:
        target.shutdown()
        target.server_close()


def test_bad_tool_flags_stop_the_server(tmp_path):
    done = run_server_command("--tools", "read_file,teleport", timeout=120)
    assert done.returncode == 1 and 'unknown tool "teleport"' in done.stderr
    done = run_server_command("--mcp-servers-json", "not json", timeout=120)
    assert done.returncode == 1 and "failed to parse MCP config JSON" in done.stderr
    done = run_server_command("--mcp-servers-config", str(tmp_path / "missing.json"), timeout=120)
    assert done.returncode == 1 and "failed to open MCP config file" in done.stderr
