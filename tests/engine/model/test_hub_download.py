"""``-hf`` downloads through huggingface_hub into the cache, against a stand-in hub on 127.0.0.1
(``fake_hub``): the hub's listing decides (the default quant it has beats another the cache has),
every part of a split model and every file of a model directory comes down, progress is reported,
the next resolution asks the hub nothing, and a repository or quant the hub lacks is a clear error
(not an "unreachable" one)."""

from __future__ import annotations

import pytest
from fake_hub import FakeHub
from hub_cache import gguf_repo
from huggingface_hub import constants

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model import hub

REMOTE = {
    "acme/remote-GGUF": {"r-Q8_0.gguf": b"q8" * 50_000, "r-Q4_K_M.gguf": b"q4" * 1000, "mmproj-r-F16.gguf": b"p",
                         "big-F16-00001-of-00002.gguf": b"one", "big-F16-00002-of-00002.gguf": b"two"},
    "acme/remote-mlx": {"config.json": b"{}", "model.safetensors": b"w", "tokenizer.json": b"{}",
                        "README.md": b"readme"},
}


@pytest.fixture
def server(tmp_path, monkeypatch):
    fake = FakeHub(REMOTE)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield fake
    fake.close()


def test_a_gguf_comes_down_with_progress_and_is_then_served_from_the_cache(server):
    seen: list[tuple[str, int, int | None]] = []
    model = hub.resolve("acme/remote-GGUF:q8_0", progress=lambda f, done, total: seen.append((f, done, total)))
    assert model.path.name == "r-Q8_0.gguf" and model.path.read_bytes() == REMOTE["acme/remote-GGUF"]["r-Q8_0.gguf"]
    assert seen[-1] == ("r-Q8_0.gguf", 100_000, 100_000)
    assert not any("mmproj" in r for r in server.requests)  # the projector is recorded, not fetched
    assert model.choice.mmproj == "mmproj-r-F16.gguf"
    server.requests.clear()
    assert hub.resolve("acme/remote-GGUF:Q8_0").path == model.path
    assert server.requests == []


def test_with_no_quant_the_hub_default_beats_another_quant_in_the_cache(server, tmp_path):
    gguf_repo(tmp_path / "hub", "acme/remote-GGUF", {}, dummies=("r-Q8_0.gguf",))
    assert hub.resolve("acme/remote-GGUF").path.name == "r-Q4_K_M.gguf"  # as upstream, which lists the hub


def test_split_parts_and_directories_come_down_whole(server):
    model = hub.resolve("acme/remote-GGUF:F16")
    assert model.path.name == "big-F16-00001-of-00002.gguf"
    assert (model.path.parent / "big-F16-00002-of-00002.gguf").read_bytes() == b"two"
    directory = hub.resolve("acme/remote-mlx").path
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_what_the_hub_lacks_is_a_clear_error(server):
    with pytest.raises(ModelLoadError, match="was not found on Hugging Face") as err:
        hub.resolve("acme/missing")
    assert not isinstance(err.value, hub.HubUnreachableError)
    with pytest.raises(ModelLoadError, match="quants F16, Q4_K_M, Q8_0") as err:
        hub.resolve("acme/remote-GGUF:Q2_K")
    assert not isinstance(err.value, hub.HubUnreachableError)
