"""Access on a real server: API keys (``--api-key`` with several keys, ``--api-key-file``) are
enforced on every route but upstream's public ones (``/health``, ``/v1/health``, the page; not the
model list), with upstream's exact 401 body; CORS headers and preflights as upstream sends them; no
route touches a file a request names; without a key the web UI's CORS proxy serves only its own
origin, and a malformed target URL is a 400."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from server_process import REPO, ServerProcess

from mlxcel.server.cli import compat_record
from mlxcel.server.cli.args import parse_args
from mlxcel.server.http.gate.cors import Cors
from mlxcel.server.runtime.config import ServerConfig

UPSTREAM_401 = b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}'
PUBLIC = {"/health", "/v1/health", "/", "/index.html"}  # the page: UI assets are public upstream


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text("# one key per line\nfile-key-1\n\n  file-key-2  \n# file-key-3 is commented out\n")
    return path


@pytest.fixture(scope="module")
def server(tiny_llama_dir, key_file):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "1", "--api-key", "cli-key-1,cli-key-2",
                         "--api-key-file", str(key_file), "--metrics", "--ui-mcp-proxy")
    yield proc
    proc.stop()


def recorded_routes() -> list[tuple[str, str]]:
    data = json.loads((compat_record.record_dir(REPO) / "routes.json").read_text())
    return [(r["method"], r["path"].replace("{id_slot}", "0")) for r in data["routes"] if r["state"] != "planned"]


@pytest.mark.parametrize("method, path", recorded_routes())
def test_every_route_but_the_public_ones_needs_a_key(server, method, path):
    r = httpx.request(method, server.url + path, content=b"{}", timeout=30)
    if path in PUBLIC:  # public by path, as upstream
        assert r.status_code == 200, r.text[:200]
    else:
        assert r.status_code == 401 and r.content == UPSTREAM_401, (r.status_code, r.text[:200])
        r = httpx.request(method, server.url + path, content=b"{}", timeout=30,
                          headers={"Authorization": "Bearer cli-key-2"})
        assert r.status_code != 401


@pytest.mark.parametrize("header", [
    {"Authorization": "Bearer cli-key-1"}, {"Authorization": "Bearer cli-key-2"},
    {"Authorization": "Bearer file-key-1"}, {"Authorization": "Bearer file-key-2"},
    {"authorization": "bearer file-key-1"}, {"X-Api-Key": "cli-key-1"},
    {"Authorization": "cli-key-1"},  # upstream strips "Bearer " only when present
])
def test_each_configured_key_is_accepted(server, header):
    r = httpx.post(server.url + "/completion", json={"prompt": "hi", "n_predict": 2}, headers=header, timeout=30)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


@pytest.mark.parametrize("header", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic cli-key-1"},
    {"Authorization": "Bearer wrong", "X-Api-Key": "cli-key-1"},  # X-Api-Key is read only without Authorization
    {"Authorization": "Bearer cli-key"}, {"Authorization": "Bearer cli-key-1x"}, {"Authorization": "Bearer"},
    {"Authorization": "Bearer # file-key-3 is commented out"}, {"Authorization": "Bearer file-key-3"},
    {"X-Api-Key": ""}, {"X-Api-Key": "wrong"},
])
def test_wrong_or_missing_keys_get_upstreams_401(server, header):
    for path in ("/completion", "/v1/chat/completions", "/tokenize", "/slots", "/metrics", "/props"):
        method = "GET" if path in ("/slots", "/metrics", "/props") else "POST"
        r = httpx.request(method, server.url + path, content=b'{"prompt": "hi"}', headers=header, timeout=30)
        assert r.status_code == 401 and r.content == UPSTREAM_401, (path, r.status_code, r.text[:200])
        assert r.headers["content-type"] == "application/json; charset=utf-8"


def test_cors_headers_and_preflight_as_upstream(server):
    origin = "http://chat.example"
    r = httpx.get(server.url + "/health", headers={"Origin": origin})
    assert r.headers["access-control-allow-origin"] == origin
    r = httpx.get(server.url + "/health")
    assert r.headers["access-control-allow-origin"] == ""  # upstream echoes the (absent) Origin
    r = httpx.post(server.url + "/completion", json={"prompt": "hi"}, headers={"Origin": origin})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == origin
    # a preflight carries no key and is answered before the key check
    r = httpx.options(server.url + "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200 and r.content == b""
    assert r.headers["access-control-allow-origin"] == origin
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "*"


def test_cors_origin_choices():
    assert Cors().allow_origin(b"http://a.example") == b"http://a.example"
    fixed = Cors(origins="https://ui.example", credentials=True)
    assert fixed.allow_origin(b"http://evil.example") == b"https://ui.example"
    assert Cors(origins="*", credentials=False).allow_origin(b"http://a.example") == b"*"
    local = Cors(origins="localhost")
    assert local.allow_origin(b"http://localhost:5173") == b"http://localhost:5173"
    assert local.allow_origin(b"http://127.0.0.1:3000") == b"http://127.0.0.1:3000"
    assert local.allow_origin(b"http://localhost.evil.example") is None
    assert local.allow_origin(b"") is None
    c = parse_args(["--cors-origins", "localhost", "--cors-methods", "GET", "--cors-headers", "x-a",
                    "--no-cors-credentials"])
    assert (c.cors_origins, c.cors_methods, c.cors_headers, c.cors_credentials) == ("localhost", "GET", "x-a", False)
    # as upstream: the web UI's tools make the default origin localhost; an explicit one wins
    assert Cors.from_config(parse_args([])).origins == "*"
    assert Cors.from_config(parse_args(["--tools", "all"])).origins == "localhost"
    assert Cors.from_config(parse_args(["--tools", "all", "--cors-origins", "*"])).origins == "*"


def test_default_bind_is_loopback():
    assert ServerConfig().host == "127.0.0.1" and parse_args([]).host == "127.0.0.1"


def test_no_route_reads_or_writes_a_file_a_request_names(server, tmp_path):
    """Names of files in request bodies and queries are never opened: a FIFO that would block a
    reader and a path that would be created are both left alone, and the requests return at once."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "written.bin"
    auth = {"Authorization": "Bearer cli-key-1"}
    calls = [
        ("POST", "/slots/0?action=save", {"filename": str(target)}),
        ("POST", "/slots/0?action=restore", {"filename": str(fifo)}),
        ("POST", "/props", {"chat_template_file": str(fifo), "api_key_file": str(fifo)}),
        ("POST", "/completion", {"prompt": "hi", "n_predict": 1, "model": str(fifo), "grammar_file": str(fifo),
                                 "slot_save_path": str(tmp_path), "filename": str(target)}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                          "chat_template_kwargs": {"file": str(fifo)}, "model": str(fifo)}),
        ("POST", "/lora-adapters", [{"id": 0, "path": str(fifo)}]),
        ("POST", "/tokenize", {"content": str(fifo)}),
        # the web UI's tools and proxy are off without --tools / an MCP config / --ui-mcp-proxy: 403
        ("POST", "/tools", {"tool": "read_file", "params": {"path": str(fifo)}}),
        ("POST", "/tools", {"tool": "write_file", "params": {"path": str(target), "content": "x"}}),
        ("GET", f"/cors-proxy?url=file://{fifo}", None),
    ]
    for method, path, body in calls:
        r = httpx.request(method, server.url + path, json=body, headers=auth, timeout=10)
        assert r.status_code < 500 or r.json()["error"]["type"] == "not_supported_error", (path, r.text[:200])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


@pytest.fixture(scope="module")
def open_proxy(tmp_path_factory):
    """A server with the web UI's CORS proxy and no API key (a router with no models: nothing loads)."""
    empty = tmp_path_factory.mktemp("open-proxy") / "no-models.ini"
    empty.write_text("; no models\n")
    proc = ServerProcess("--models-preset", str(empty), "--ui-mcp-proxy", timeout=120)
    yield proc
    proc.stop()


def test_a_keyless_cors_proxy_serves_only_its_own_origin(open_proxy):
    """Any page the user opens could otherwise read any URL this machine reaches through it."""
    port = open_proxy.port
    own = f"http://127.0.0.1:{port}"
    url = open_proxy.url + "/cors-proxy"
    params = {"url": open_proxy.url + "/health"}
    for headers in ({}, {"Origin": own}, {"Origin": own, "Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
                    {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}):
        r = httpx.get(url, params=params, headers=headers, timeout=30)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, (headers, r.text[:200])
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "http://127.0.0.1:1"}, {"Origin": "null"},
                    {"Origin": f"http://localhost:{port}"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"}, {"Origin": own, "Sec-Fetch-Site": "cross-site"},
                    # DNS rebinding: a name another site controls, resolved to this server
                    {"Host": f"evil.example:{port}"},
                    {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}):
        for method in ("GET", "POST"):
            r = httpx.request(method, url, params=params, headers=headers, timeout=30)
            assert r.status_code == 403, (method, headers, r.text[:200])
            assert r.json()["error"]["type"] == "permission_error" and "same-origin" in r.json()["error"]["message"]
    # said at startup: the whole log is read, as the refusals above may push the line out of log()'s tail
    assert "--ui-mcp-proxy without an API key" in open_proxy.log_path.read_text(errors="replace")


def test_with_a_key_the_key_is_the_cors_proxy_check(server):
    r = httpx.get(server.url + "/cors-proxy", params={"url": server.url + "/health"}, timeout=30,
                  headers={"Authorization": "Bearer cli-key-1", "Origin": "http://elsewhere.example",
                           "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text[:200]


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/", "http://127.0.0.1:0/", "http://[::1/", "http://[zz]/",
                                 "http://host:abc/", "http://host:-1/", "http://xn--a.com/", "http://\x00/",
                                 "http://:80/", "ftp://127.0.0.1/", "nothing"])
def test_a_malformed_proxy_target_is_a_400(open_proxy, url):
    r = httpx.get(open_proxy.url + "/cors-proxy", params={"url": url}, timeout=30)
    assert r.status_code == 400, r.text[:200]
    assert r.json()["error"]["type"] == "invalid_request_error"
