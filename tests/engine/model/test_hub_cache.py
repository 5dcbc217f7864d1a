"""``-hf`` / ``-hff`` / ``-hfd`` resolved against a folder laid out as the Hugging Face cache, with
no network: offline (``HF_HUB_OFFLINE=1``) by the full rules, online without a single request when
the cache holds the file; errors that say what the cache has; split GGUFs fetched whole and then
refused with how to join them; the projector recorded; a model directory checked for completeness;
and the load progress line in the log (info for a big file, debug for a small one)."""

from __future__ import annotations

import json
import logging

import pytest
from fake_hub import FakeHub
from gguf import GGMLQuantizationType as Q
from hub_cache import add_repo, gguf_repo
from huggingface_hub import constants

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model import hub, load_progress
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform.settings import switched

REPO = "acme/tiny-GGUF"


@pytest.fixture(scope="module")
def ggufs(tiny_llama_dir, tmp_path_factory):
    import tiny_gguf

    out = tmp_path_factory.mktemp("hub-ggufs")
    return {"F32": tiny_gguf.write_gguf(tiny_llama_dir, out / "f32.gguf"),
            "Q8_0": tiny_gguf.write_gguf(tiny_llama_dir, out / "q8.gguf", tiny_gguf.uniform(Q.Q8_0))}


@pytest.fixture
def cache(tmp_path, monkeypatch, ggufs):
    """A cache holding ``acme/tiny-GGUF`` (a Q4_K_M and a Q8_0 model, a projector, a split model),
    used offline unless a test says otherwise."""
    root = tmp_path / "hub"
    gguf_repo(root, REPO, {"tiny-Q4_K_M.gguf": ggufs["F32"], "tiny-Q8_0.gguf": ggufs["Q8_0"]},
              dummies=("mmproj-tiny-F16.gguf", "big-F16-00001-of-00002.gguf", "big-F16-00002-of-00002.gguf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


@pytest.fixture
def online(monkeypatch):
    """Online mode against a stand-in hub that records every request (and holds the repository too)."""
    server = FakeHub({REPO: {"tiny-Q4_K_M.gguf": b"remote", "tiny-Q8_0.gguf": b"remote too"}})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()


def test_offline_picks_the_default_and_the_named_quant(cache):
    assert hub.resolve(REPO).path.name == "tiny-Q4_K_M.gguf"
    model = hub.resolve(f"{REPO}:q8_0")
    assert model.path.name == "tiny-Q8_0.gguf" and model.path.is_relative_to(cache)
    assert model.choice.mmproj == "mmproj-tiny-F16.gguf"
    assert hub.resolve(f"{REPO}:Q8_0", hf_file="tiny-Q4_K_M.gguf").path.name == "tiny-Q4_K_M.gguf"  # -hff wins


def test_offline_misses_are_clear_errors(cache):
    with pytest.raises(ModelLoadError) as err:
        hub.resolve(f"{REPO}:Q5_K_S")
    assert "no GGUF file for quant 'Q5_K_S'" in str(err.value) and "quants F16, Q4_K_M, Q8_0" in str(err.value)
    assert "offline" in str(err.value)
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        hub.resolve("acme/never-downloaded")


def test_no_request_reaches_the_hub_when_the_cache_holds_the_file(cache, online):
    assert hub.resolve(REPO).path.name == "tiny-Q4_K_M.gguf"
    assert hub.resolve(f"{REPO}:Q8_0").path.name == "tiny-Q8_0.gguf"
    assert hub.resolve(REPO, hf_file="tiny-Q8_0.gguf").path.name == "tiny-Q8_0.gguf"
    assert hub.resolve(REPO).path.read_bytes() != b"remote"  # the cached file, not the hub's
    assert online.requests == []


def test_a_split_model_is_fetched_whole_then_refused_with_how_to_join_it(cache, tmp_path):
    model = hub.resolve(f"{REPO}:F16")
    assert model.path.name == "big-F16-00001-of-00002.gguf" and len(model.choice.files) == 2
    assert all((model.path.parent / f).is_file() for f in model.choice.files)
    with pytest.raises(ModelLoadError, match="llama-gguf-split --merge"):
        load_model(hf_repo=f"{REPO}:F16")
    add_repo(tmp_path / "hub", "acme/half-split", {"m-Q8_0-00001-of-00002.gguf": b"one"})
    with pytest.raises(ModelLoadError, match=r"part\(s\) 2 are missing"):
        hub.resolve("acme/half-split")


def test_a_cached_model_directory_must_be_complete(cache, tiny_llama_dir, tmp_path):
    files = {p.name: p for p in tiny_llama_dir.iterdir()}
    snapshot = add_repo(tmp_path / "hub", "acme/tiny-mlx", files)
    assert hub.resolve("acme/tiny-mlx").path == snapshot
    index = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}).encode()
    add_repo(tmp_path / "hub", "acme/partial", {"config.json": files["config.json"],
                                                "model.safetensors.index.json": index})
    with pytest.raises(ModelLoadError, match="lacks weight files"):
        hub.resolve("acme/partial")


def test_loading_from_hf_records_the_projector_and_reports_progress(cache, caplog):
    with caplog.at_level(logging.DEBUG, logger="mlxcel.engine.model"):
        loaded = load_model(hf_repo=f"{REPO}:Q8_0")
    assert loaded.path.name == "tiny-Q8_0.gguf" and loaded.metadata["hub_mmproj"] == "mmproj-tiny-F16.gguf"
    progress = [r for r in caplog.records if "of tensors" in r.getMessage()]
    assert progress and progress[-1].getMessage().startswith("tiny-Q8_0.gguf: loaded 100% of tensors")
    assert all(r.levelno == logging.DEBUG for r in progress)  # a small file reports at the debug level only
    assert any("multimodal projector (fetched and loaded" in r.getMessage() for r in caplog.records)
    # this projector is a placeholder, not a GGUF: the model is served as a text model, with a warning saying why
    assert loaded.vision is None
    assert any("as a text model" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_small_file_reports_at_the_debug_level_unless_the_threshold_is_lowered(cache, caplog):
    with caplog.at_level(logging.INFO, logger="mlxcel.engine.model"):
        load_model(hf_repo=REPO)
    assert not any("of tensors" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with switched(load_progress_min_mb=0), caplog.at_level(logging.INFO, logger="mlxcel.engine.model"):
        load_model(hf_repo=REPO)
    assert any(r.getMessage().startswith("tiny-Q4_K_M.gguf: loaded 100% of tensors") for r in caplog.records)


def test_progress_lines_come_at_most_once_per_interval(tmp_path, caplog):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"x" * 100)
    now = [0.0]

    def clock():
        now[0] += 0.3  # each tensor takes 0.3 s
        return now[0]

    with caplog.at_level(logging.INFO, logger="mlxcel.engine.model.load_progress"):
        assert list(load_progress.tracked(list(range(20)), path, threshold=0, interval=1.0, clock=clock)) == \
            list(range(20))
    lines = [r.getMessage() for r in caplog.records]
    middle = [m for m in lines if "of tensors (" in m and "100%" not in m]
    assert lines[0].startswith("m.gguf: loading 20 tensors") and "loaded 100% of tensors (20/20" in lines[-1]
    assert 4 <= len(middle) <= 6  # 20 x 0.3 s = 6 s: one line a second, not one per tensor
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mlxcel.engine.model.load_progress"):
        list(load_progress.tracked(list(range(20)), path, threshold=101, clock=clock))
    assert not caplog.records  # below the threshold: nothing at the info level


def test_hfd_with_md_loads_the_named_file_of_the_draft_repository(cache, tiny_llama, caplog):
    """-hfd REPO -md FILE: upstream reads -md as the draft repository's file (its --hf-file)."""
    from mlxcel.drafters.draft_model_source import load_source
    from mlxcel.drafters.registry import DRAFT_MODEL
    from mlxcel.drafters.source import SourceRequest

    request = SourceRequest(DRAFT_MODEL.drafter_class(), tiny_llama, draft_model="tiny-Q8_0.gguf", draft_hf=REPO,
                            default_block=3)
    with caplog.at_level(logging.INFO, logger="mlxcel.engine.model.hub"):
        load_source(request)
    assert any(r.getMessage().endswith("tiny-Q8_0.gguf") and "resolved to" in r.getMessage() for r in caplog.records)
