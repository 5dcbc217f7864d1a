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
                 lookup=partial(ServerProcess, *common, "--spec-type", "ngram-simple")) as procs:
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
