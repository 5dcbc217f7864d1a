"""Router mode on a real server: models from a preset INI, each served by a child mlxcel-server
the router starts on demand and proxies to; ``--models-max 1`` evicts the least recently used
idle model; ``/models`` reports each one's status; load / unload by hand; upstream's errors;
API keys checked by the router on every route but health; the children answer only the router;
status events on ``/models/sse``."""

from __future__ import annotations

import json
import threading
import time

import httpx
import psutil
import pytest
from server_process import ServerProcess

KEY = {"Authorization": "Bearer rk"}


@pytest.fixture(scope="module")
def preset(tiny_llama_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("router") / "models.ini"
    path.write_text(f"[*]\nc = 256\n; a comment\n\n[a]\nmodel = {tiny_llama_dir}\n\n"
                    f"[b]\nmodel = {tiny_llama_dir}\nalias = bee\nnp = 1\n")
    return path


@pytest.fixture(scope="module")
def router(preset):
    proc = ServerProcess("--models-preset", str(preset), "--models-max", "1", "--api-key", "rk", "--temp", "0",
                         "--hf-token", "hf-secret", timeout=120)
    yield proc
    proc.stop()


def models(router) -> dict[str, dict]:
    r = httpx.get(router.url + "/models", headers=KEY, timeout=30)
    assert r.status_code == 200
    return {m["id"]: m for m in r.json()["data"]}


def wait_status(router, name: str, want: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (status := models(router)[name]["status"]["value"]) != want:
        assert time.monotonic() < deadline, f"{name} stayed {status}"
        time.sleep(0.2)


def test_listing_props_and_errors(router):
    props = httpx.get(router.url + "/props", headers=KEY, timeout=30).json()
    assert props["role"] == "router" and props["max_instances"] == 1 and props["models_autoload"] is True
    listed = models(router)
    assert set(listed) == {"a", "b"} and listed["b"]["aliases"] == ["bee"]
    assert listed["a"]["status"]["value"] == "unloaded" and "ctx-size = 256" in listed["a"]["status"]["preset"]
    assert "--ctx-size" in listed["a"]["status"]["args"] and "--temperature" in listed["a"]["status"]["args"]
    post = {"prompt": "hi", "n_predict": 2}
    r = httpx.post(router.url + "/completion", json=post, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model name is missing from the request"
    r = httpx.post(router.url + "/completion", json={**post, "model": "zzz"}, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model 'zzz' not found"
    r = httpx.post(router.url + "/completion", json={**post, "model": "a"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(router.url + "/completion?autoload=0", json={**post, "model": "a"}, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"


def test_every_router_route_but_health_needs_the_key(router):
    for method, path in (("GET", "/models"), ("GET", "/v1/models"), ("GET", "/models?reload=1"),
                         ("DELETE", "/models?model=a"), ("POST", "/models"), ("POST", "/models/load"),
                         ("POST", "/models/unload"), ("GET", "/models/sse"), ("GET", "/props"),
                         ("GET", "/slots?model=a"), ("GET", "/metrics?model=a"), ("POST", "/completion"),
                         ("GET", "/tools"), ("GET", "/cors-proxy"), ("POST", "/v1/messages")):
        r = httpx.request(method, router.url + path, json={"model": "a"}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (method, path, r.text)
    for path in ("/health", "/v1/health", "/"):
        assert httpx.get(router.url + path, timeout=30).status_code == 200


def test_a_request_loads_its_model_and_is_proxied(router):
    r = httpx.post(router.url + "/completion", json={"model": "a", "prompt": "hi", "n_predict": 3}, headers=KEY,
                   timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] == 3 and r.json()["model"] == "a"
    listed = models(router)
    assert listed["a"]["status"]["value"] == "loaded" and listed["a"]["meta"]["n_ctx"] == 256


@pytest.mark.slow
def test_autoload_eviction_and_manual_control(router):
    events: list[dict] = []

    def listen():
        with httpx.stream("GET", router.url + "/models/sse", headers=KEY, timeout=None) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))

    threading.Thread(target=listen, daemon=True).start()
    r = httpx.post(router.url + "/completion", json={"model": "a", "prompt": "hi", "n_predict": 3}, headers=KEY,
                   timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] == 3 and r.json()["model"] == "a"
    assert models(router)["a"]["status"]["value"] == "loaded"
    # the alias names b; with --models-max 1 the idle a makes room
    r = httpx.post(router.url + "/v1/chat/completions", headers=KEY, timeout=300,
                   json={"model": "bee", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    listed = models(router)
    assert listed["b"]["status"]["value"] == "loaded" and listed["a"]["status"]["value"] == "unloaded"
    slots = httpx.get(router.url + "/slots?model=b", headers=KEY, timeout=30).json()
    assert len(slots) == 1  # the child's own -np 1
    assert httpx.post(router.url + "/models/unload", json={"model": "b"}, headers=KEY, timeout=30).json() == \
        {"success": True}
    wait_status(router, "b", "unloaded")
    r = httpx.post(router.url + "/models/unload", json={"model": "b"}, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is not running"
    assert httpx.post(router.url + "/models/load", json={"model": "a"}, headers=KEY, timeout=30).json() == \
        {"success": True}
    r = httpx.post(router.url + "/models/load", json={"model": "a"}, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is already running"
    assert httpx.post(router.url + "/models/load", json={"model": "nope"}, headers=KEY, timeout=30).status_code == 404
    wait_status(router, "a", "loaded")
    seen = [(e["model"], e.get("data", {}).get("status")) for e in events if e["event"] == "status_change"]
    assert ("a", "loaded") in seen and ("b", "unloaded") in seen


def test_reload_reads_the_preset_again(router, preset, tiny_llama_dir):
    original = preset.read_text()
    try:
        preset.write_text(f"[*]\nc = 256\n\n[a]\nmodel = {tiny_llama_dir}\n\n[c]\nmodel = {tiny_llama_dir}\n")
        r = httpx.get(router.url + "/models?reload=1", headers=KEY, timeout=120)
        assert {m["id"] for m in r.json()["data"]} == {"a", "c"}
    finally:
        preset.write_text(original)
        r = httpx.get(router.url + "/models?reload=1", headers=KEY, timeout=120)
        assert {m["id"] for m in r.json()["data"]} == {"a", "b"}


def test_children_answer_only_the_router(router):
    """A child listens on a loopback port any local process could reach: it takes only the router's
    private credential, which is neither on its command line nor in the model list, nor its port."""
    r = httpx.post(router.url + "/completion", json={"model": "a", "prompt": "hi", "n_predict": 1}, headers=KEY,
                   timeout=300)
    assert r.status_code == 200, r.text
    listing = httpx.get(router.url + "/models", headers=KEY, timeout=30)
    status = {m["id"]: m for m in listing.json()["data"]}["a"]["status"]
    child = next(c for c in psutil.Process(router.proc.pid).children()
                 if "--alias" in c.cmdline() and c.cmdline()[c.cmdline().index("--alias") + 1] == "a")
    argv = child.cmdline()
    port = argv[argv.index("--port") + 1]
    credential = child.environ()["LLAMA_API_KEY"]
    assert len(credential) >= 32 and credential not in " ".join(argv) and "--api-key" not in argv
    assert credential not in listing.text
    assert "hf-secret" not in " ".join(argv) and "hf-secret" not in listing.text  # secrets go by environment
    assert child.environ()["HF_TOKEN"] == "hf-secret"
    assert "--port" not in status["args"] and port not in status["args"] and "--ctx-size" in status["args"]
    child_url = f"http://127.0.0.1:{port}"
    assert httpx.get(child_url + "/health", timeout=30).status_code == 200
    for headers in ({}, KEY):  # the router's own key does not open a child
        r = httpx.get(child_url + "/v1/models", headers=headers, timeout=30)
        assert r.status_code == 401, r.text
        r = httpx.post(child_url + "/completion", json={"prompt": "hi", "n_predict": 1}, headers=headers, timeout=30)
        assert r.status_code == 401, r.text
    ok = httpx.get(child_url + "/v1/models", headers={"Authorization": f"Bearer {credential}"}, timeout=30)
    assert ok.status_code == 200
