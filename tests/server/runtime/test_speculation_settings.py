"""What a drafting server says about itself, as upstream says it: ``/slots`` marks every slot
speculative and completions echo ``speculative.types`` as ``none,<spec type>``; ``/props``
keeps ``none`` (upstream's default generation settings carry no drafter)."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
from server_process import ServerProcess, running


@pytest.fixture(scope="module")
def servers(tiny_llama_dir):
    common = ("-m", str(tiny_llama_dir), "-np", "2")
    with running(plain=partial(ServerProcess, *common),
                 lookup=partial(ServerProcess, *common, "--spec-type", "ngram-simple"),
                 combined=partial(ServerProcess, *common, "--spec-type", "ngram-cache,ngram-map-k",
                                  "--spec-ngram-map-k-size-n", "2", "--spec-ngram-map-k-size-m", "8")) as procs:
        yield procs


@pytest.mark.parametrize("name,speculative,types", [("plain", False, "none"), ("lookup", True, "none,ngram-simple")])
def test_slots_and_generation_settings(servers, name, speculative, types):
    server = servers[name]
    body = httpx.post(server.url + "/completion", json={"prompt": "a b a b a b", "n_predict": 4, "temperature": 0},
                      timeout=60).json()
    assert body["generation_settings"]["speculative.types"] == types
    slots = httpx.get(server.url + "/slots", timeout=30).json()
    assert [s["speculative"] for s in slots] == [speculative] * 2
    used = [s["params"]["speculative.types"] for s in slots if "params" in s]
    assert used == [types]
    props = httpx.get(server.url + "/props", timeout=30).json()
    assert props["default_generation_settings"]["params"]["speculative.types"] == "none"


def test_combined_ngram_types_answer_to_their_names_and_learn_across_a_slot_requests(servers):
    """Two n-gram types on one server: ``speculative.types`` names them as the command line did, the timings
    name the drafters that ran, a request may ask for either by ``speculative.type`` (not for another), and
    the same request again in the same slot drafts more (the slot's n-gram cache kept what the first saw)."""
    server = servers["combined"]
    body = {"prompt": "The quick brown fox jumps over the lazy dog. Hello, world! How are you today?",
            "n_predict": 40, "temperature": 0, "ignore_eos": True, "id_slot": 0, "cache_prompt": False}
    first = httpx.post(server.url + "/completion", json=body, timeout=60).json()
    second = httpx.post(server.url + "/completion", json=body, timeout=60).json()
    plain = httpx.post(servers["plain"].url + "/completion", json=body, timeout=60).json()
    assert first["content"] == second["content"] == plain["content"]
    assert first["generation_settings"]["speculative.types"] == "none,ngram-cache,ngram-map-k"
    assert second["timings"]["draft_kind"] == "ngram-map-k+ngram-cache"
    assert second["timings"]["draft_n_accepted"] > first["timings"].get("draft_n_accepted", 0)
    asked = httpx.post(server.url + "/completion", json={**body, "speculative.type": "ngram-map-k"}, timeout=60)
    assert asked.status_code == 200
    other = httpx.post(server.url + "/completion", json={**body, "speculative.type": "ngram-mod"}, timeout=60)
    assert other.status_code == 400 and other.json()["error"]["type"] == "invalid_request_error"
