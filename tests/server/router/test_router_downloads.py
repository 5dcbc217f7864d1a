"""``POST /models`` on a real router: a model added by its Hugging Face repository is downloaded into
the cache (from a stand-in hub on 127.0.0.1, ``fake_hub``) or found there (no request then), listed
by ``GET /models`` (``downloading``, then ``unloaded``), announced on ``/models/sse``, kept by a
reload, and served by a child started with ``--hf-repo <name>``; the router's ``-hfd`` reaches the
child, whose draft model comes from the cache too. Bad names, missing quants and unknown
repositories are 400s that say what the repository has. The child's log shows the load progress
line (``MLXCEL_LOAD_PROGRESS_MIN_MB=0``: at the info level even for these small files)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from fake_hub import FakeHub
from gguf import GGMLQuantizationType as Q
from hub_cache import gguf_repo
from server_process import ServerProcess

REMOTE = "acme/remote-GGUF"
CACHED = "acme/tiny-GGUF"


@pytest.fixture(scope="module")
def files(tiny_llama_dir, tmp_path_factory):
    import tiny_gguf

    out = tmp_path_factory.mktemp("router-hub")
    return {"F32": tiny_gguf.write_gguf(tiny_llama_dir, out / "f32.gguf"),
            "Q8_0": tiny_gguf.write_gguf(tiny_llama_dir, out / "q8.gguf", tiny_gguf.uniform(Q.Q8_0)), "root": out}


@pytest.fixture(scope="module")
def hub_server(files):
    server = FakeHub({REMOTE: {"remote-Q8_0.gguf": files["Q8_0"].read_bytes(), "remote-Q4_K_M.gguf": b"unused",
                               "mmproj-remote-F16.gguf": b"unused"},
                      CACHED: {"tiny-Q4_K_M.gguf": b"not this", "tiny-Q8_0.gguf": b"nor this"}})
    yield server
    server.close()


@pytest.fixture(scope="module")
def router(files, hub_server):
    cache = files["root"] / "hub"
    gguf_repo(cache, CACHED, {"tiny-Q4_K_M.gguf": files["F32"], "tiny-Q8_0.gguf": files["Q8_0"]})
    (files["root"] / "models").mkdir()
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub_server.url, "HF_HUB_OFFLINE": "0",
           "MLXCEL_LOAD_PROGRESS_MIN_MB": "0"}
    proc = ServerProcess("--models-dir", str(files["root"] / "models"), "-hfd", CACHED, "-c", "256", "-np", "1",
                         "--temp", "0", env=env, timeout=120)
    yield proc
    proc.stop()


def listed(router) -> dict[str, dict]:
    r = httpx.get(router.url + "/models", timeout=30)
    assert r.status_code == 200
    return {m["id"]: m for m in r.json()["data"]}


def wait_listed_as(router, name: str, status: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (now := listed(router).get(name, {}).get("status", {}).get("value")) != status:
        assert time.monotonic() < deadline, f"{name} stayed {now}"
        time.sleep(0.2)


def post(router, name) -> httpx.Response:
    return httpx.post(router.url + "/models", json={"model": name}, timeout=120)


def test_bad_names_and_missing_quants_are_400s_that_list_the_repository(router, hub_server):
    r = post(router, f"{CACHED}:Q5_K_S")
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "no GGUF file for quant 'Q5_K_S'" in message and "quants Q4_K_M, Q8_0" in message
    r = post(router, "not-a-repo")
    assert r.status_code == 400 and "expected <user>/<model>[:quant]" in r.json()["error"]["message"]
    r = post(router, "acme/missing")
    assert r.status_code == 400 and "was not found on Hugging Face" in r.json()["error"]["message"]
    r = httpx.post(router.url + "/models", json={}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model must be a non-empty string"
    assert not {f"{CACHED}:Q5_K_S", "acme/missing"} & set(listed(router))


def test_a_cached_model_is_added_without_asking_the_hub(router, hub_server):
    name = f"{CACHED}:q8_0"
    hub_server.requests.clear()
    r = post(router, name)
    assert r.status_code == 200 and r.json() == {"success": True}
    wait_listed_as(router, name, "unloaded")
    entry = listed(router)[name]
    assert entry["source"] == "cache" and "--hf-repo" in entry["status"]["args"]
    assert not any(CACHED in request for request in hub_server.requests)
    r = post(router, name)
    assert r.status_code == 400 and r.json()["error"]["message"] == f"model '{name}' already exists"
    r = httpx.get(router.url + "/models?reload=1", timeout=60)
    assert name in {m["id"] for m in r.json()["data"]}  # no source file names it, and it stays


def test_a_downloaded_model_is_announced_listed_and_served(router, hub_server):
    events: list[dict] = []
    subscribed = threading.Event()

    def listen():
        with httpx.stream("GET", router.url + "/models/sse", timeout=None) as r:
            subscribed.set()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))

    threading.Thread(target=listen, daemon=True).start()
    assert subscribed.wait(30)
    time.sleep(0.5)  # the router registers the stream once its first bytes are out
    name = f"{REMOTE}:Q8_0"
    assert post(router, name).json() == {"success": True}
    wait_listed_as(router, name, "unloaded")
    assert any(r.endswith("/remote-Q8_0.gguf") for r in hub_server.requests)
    assert not any("mmproj" in r for r in hub_server.requests)
    mine = [e for e in events if e["model"] == name]
    assert any(e["event"] == "download_finished" for e in mine), mine
    assert any(e["event"] == "download_progress" for e in mine), mine

    body = {"model": name, "prompt": "hi", "n_predict": 4, "temperature": 0}
    r = httpx.post(router.url + "/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == name and r.json()["tokens_predicted"] == 4
    assert r.json()["timings"]["draft_kind"] == "draft-model"  # the router's -hfd, resolved in the child
    props = httpx.get(router.url + "/props", params={"model": name}, timeout=30).json()
    assert props["model_path"].endswith("remote-Q8_0.gguf")
    log = router.log_path.read_text(errors="replace")
    assert "remote-Q8_0.gguf: loaded 100% of tensors" in log
    assert "tiny-Q4_K_M.gguf: loaded 100% of tensors" in log  # the draft model: -hfd's default quant
