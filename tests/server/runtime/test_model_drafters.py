"""Model-based drafters inside the server, through real server processes on tiny checkpoints.

* ``-md DIR`` alone (a DFlash checkpoint), ``--spec-type draft-dspark -md DIR`` and ``--draft-kind
  muse-glimmer -md DIR`` (a Muse Glimmer target with a 16-token sliding window, so requests run
  past it) serve temperature-0 requests whose tokens equal greedy target-only decoding, token for
  token, with ``draft_kind: "dflash"`` in the timings of every route and stream shape;
* above temperature 0 the default rule serves the greedy stream (argmax-against-argmax, logged as
  such); the request field ``speculative.stochastic_accept: true`` switches that request to
  modified rejection sampling (it then samples);
* a sampling request to the DSpark server is decoded plainly, with exactly one warning;
* the startup line names the drafter and its block; the DFlash and Muse servers run with the
  exactness probe's real verdict (measured at startup; on this CPU it sends rounds to chain
  decoding) as well as with a forced one.
"""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import tiny_drafters
from server_process import ServerProcess, post_ok, running, sse_events

from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams

N = 20
TEXTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "def add(a, b):\n    return a + b\n"]
BASE_KEYS = 9
DRAFT_KEYS = ["draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"]


@pytest.fixture(scope="module")
def models(checkpoints_root):
    qwen3_dir = tiny_drafters.build_target(checkpoints_root / "srv-qwen3", "qwen3", seed=3)
    muse_dir = tiny_drafters.build_target(checkpoints_root / "srv-muse", "muse_glimmer", seed=5, window=16)
    return {
        "qwen3": load_model(qwen3_dir),
        "muse": load_model(muse_dir),
        "dflash": tiny_drafters.build_dflash(checkpoints_root / "srv-dflash", qwen3_dir, layer_ids=(1, 3)),
        "dspark": tiny_drafters.build_dspark(checkpoints_root / "srv-dspark", qwen3_dir, layer_ids=(0, 2)),
        "muse-asst": tiny_drafters.build_muse_assistant(checkpoints_root / "srv-muse-asst", muse_dir,
                                                        layer_ids=(1, 2), window=16),
    }


@pytest.fixture(scope="module")
def servers(models):
    common = ("-np", "2", "-ub", "16")
    qwen3, probe_pass = str(models["qwen3"].path), {"MLXCEL_EXACTNESS_PROBE": "pass"}
    probe_auto = {"MLXCEL_EXACTNESS_PROBE": "auto"}  # the real probe, at startup
    with running(dflash=partial(ServerProcess, "-m", qwen3, *common, "-md", str(models["dflash"]), env=probe_pass),
                 dspark=partial(ServerProcess, "-m", qwen3, *common, "--spec-type", "draft-dspark",
                                "-md", str(models["dspark"]), "--spec-draft-n-max", "4"),
                 muse=partial(ServerProcess, "-m", str(models["muse"].path), *common, "--draft-kind", "muse-glimmer",
                              "-md", str(models["muse-asst"]), env=probe_auto),
                 dflash_auto=partial(ServerProcess, "-m", qwen3, *common, "-md", str(models["dflash"]),
                                     env=probe_auto)) as procs:
        yield procs


def target_of(kind, models):
    return models["muse"] if kind == "muse" else models["qwen3"]


PROBED = {"dflash": "pass", "dspark": "auto", "muse": "auto", "dflash_auto": "auto"}  # MLXCEL_EXACTNESS_PROBE


def greedy(lm, prompt, n=N):
    chain = SamplerChain(SamplerParams(temperature=0.0), vocab_size=lm.vocab_size)
    return [s.token for s in generate_tokens(lm.model, prompt, chain, cache=lm.make_cache(), max_tokens=n)]




def stream(server, path, body):
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=180) as r:
        assert r.status_code == 200
        return [json.loads(e) for e in sse_events(r.read().decode()) if e != "[DONE]"]


def native(prompt, **fields):
    return {"prompt": prompt, "n_predict": N, "temperature": 0, "ignore_eos": True, "return_tokens": True, **fields}


def check_dflash(t: dict) -> None:
    assert list(t)[BASE_KEYS:] == DRAFT_KEYS, t
    assert t["draft_kind"] == "dflash" and t["draft_rounds"] >= 1
    assert 0 <= t["draft_n_accepted"] <= t["draft_n"]


def log_count(server, needle: str) -> int:
    return server.log_path.read_text(errors="replace").count(needle)


@pytest.mark.parametrize("kind", ["dflash", "dspark", "muse", "dflash_auto"])
def test_temperature_zero_tokens_equal_greedy_target_decoding(servers, models, kind):
    lm = target_of(kind, models)
    for text in TEXTS:
        prompt = list(lm.tokenizer.encode(text))
        body = post_ok(servers[kind], "/completion", native(prompt, id_slot=0))
        assert body["tokens"] == greedy(lm, prompt), (kind, text)
        check_dflash(body["timings"])
    # the same prompt again in the same slot: its cached prefix is reused, with the features the slot
    # kept of it (the drafter's context comes from there, not from a second pass over the prompt)
    # (not on the Muse target: its 16-token sliding window wrapped, so its cache cannot be cut back)
    again = post_ok(servers[kind], "/completion", native(prompt, id_slot=0))
    assert (again["timings"]["cache_n"] > 0) is (kind != "muse") and again["tokens"] == body["tokens"]
    check_dflash(again["timings"])
    if kind == "muse":
        assert len(prompt) + N > 16  # the sliding window wrapped during the request
    log = servers[kind].log_path.read_text(errors="replace")
    if PROBED[kind] == "auto":  # the real verdict, measured at startup: on this CPU, chain decoding
        assert "Exactness probe at load" in log and "token by token (chain decoding) at 2-" in log
    else:
        assert "forced by MLXCEL_EXACTNESS_PROBE" in log


def test_draft_kind_on_every_route_and_stream_shape(servers, models):
    s = servers["dflash"]
    text = TEXTS[0]
    check_dflash(post_ok(s, "/v1/completions", {"prompt": text, "max_tokens": N, "temperature": 0,
                                             "ignore_eos": True})["timings"])
    chat = {"messages": [{"role": "user", "content": text}], "max_tokens": N, "temperature": 0, "ignore_eos": True}
    check_dflash(post_ok(s, "/v1/chat/completions", chat)["timings"])
    events = stream(s, "/completion", native(text, timings_per_token=True))
    check_dflash(events[-1]["timings"])
    assert all(list(e["timings"]) == list(events[-1]["timings"])[:BASE_KEYS] for e in events[:-1])
    chunks = [c for c in stream(s, "/v1/chat/completions", chat) if "timings" in c]
    assert len(chunks) == 1 and chunks[0]["choices"][0]["finish_reason"] == "length"
    check_dflash(chunks[0]["timings"])
    chunks = [c for c in stream(s, "/v1/completions", {"prompt": text, "max_tokens": N, "temperature": 0,
                                                        "ignore_eos": True}) if "timings" in c]
    assert len(chunks) == 1
    check_dflash(chunks[0]["timings"])
    settings = post_ok(s, "/completion", native(text))["generation_settings"]
    assert settings["speculative.types"] == "none,draft-dflash"


def test_sampling_serves_the_greedy_stream_unless_the_request_opts_in(servers, models):
    s, lm = servers["dflash"], models["qwen3"]
    prompt = list(lm.tokenizer.encode(TEXTS[0]))
    sampled = dict(temperature=20.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)  # the tiny target is very peaked
    before = log_count(s, "rule=argmax-against-argmax")
    body = post_ok(s, "/completion", native(prompt, **sampled))
    # the first token is the prefill's own draw; from there argmax-against-argmax serves the greedy stream
    first = body["tokens"][:1]
    assert body["tokens"][1:] == greedy(lm, prompt + first, N - 1)
    check_dflash(body["timings"])
    assert log_count(s, "rule=argmax-against-argmax") == before + 1
    before = log_count(s, "rule=stochastic")
    body = post_ok(s, "/completion", native(prompt, **sampled, **{"speculative.stochastic_accept": True}))
    assert log_count(s, "rule=stochastic") == before + 1
    first = body["tokens"][:1]
    assert body["tokens"][1:] != greedy(lm, prompt + first, N - 1)  # a real sample now
    check_dflash(body["timings"])
    r = httpx.post(s.url + "/completion", json=native(prompt, **{"speculative.stochastic_accept": "sometimes"}))
    assert r.status_code == 400 and "error" in r.json()


def test_dspark_declines_a_sampling_request_with_one_warning(servers, models):
    s, lm = servers["dspark"], models["qwen3"]
    prompt = list(lm.tokenizer.encode(TEXTS[1]))
    needle = "greedy chains only"
    before = log_count(s, needle)
    body = post_ok(s, "/completion", native(prompt, temperature=0.8, seed=3))
    assert list(body["timings"])[BASE_KEYS:] == []  # decoded plainly: no draft counters
    assert log_count(s, needle) == before + 1
    body = post_ok(s, "/completion", native(prompt, temperature=0.8, top_k=1))  # top_k 1 is argmax: drafted
    check_dflash(body["timings"])
    assert log_count(s, needle) == before + 1


def test_startup_names_the_drafter_and_its_block(servers):
    log = servers["dspark"].log_path.read_text(errors="replace")
    assert "Drafter loaded: dspark" in log and "block 4" in log
    log = servers["muse"].log_path.read_text(errors="replace")
    assert "Drafter loaded: muse-glimmer" in log and "block 7" in log


@pytest.mark.parametrize("kind", ["dflash", "dspark", "muse"])
def test_a_prediction_drafts_alone_on_a_model_drafters_server(servers, models, kind):
    """A model drafter reads the target's features every round, so a request's predicted output drafts
    alone there (``draft_kind: "prediction"``), on the ragged batch or, past the Muse target's sliding
    window, on the row's own cache; the tokens are greedy target decoding's. A sampling request with a
    prediction is not declined by the greedy-only DSpark: the prediction serves it under sampler-match."""
    lm = target_of(kind, models)
    prompt = list(lm.tokenizer.encode(TEXTS[0]))
    want = greedy(lm, prompt)
    prediction = {"prediction": {"type": "content", "content": lm.tokenizer.decode(want)}}
    body = post_ok(servers[kind], "/completion", native(prompt, **prediction))
    assert body["tokens"] == want
    assert body["timings"]["draft_kind"] == "prediction" and body["timings"]["draft_n_accepted"] > 0
    assert body["accepted_prediction_tokens"] > 0
    if kind == "dspark":
        sampled = dict(temperature=0.8, seed=3)
        plain = post_ok(servers[kind], "/completion", native(prompt, **sampled, **{"speculative.n_max": 0}))
        drafted = post_ok(servers[kind], "/completion", native(prompt, **sampled, **prediction))
        assert drafted["tokens"] == plain["tokens"] and drafted["timings"]["draft_kind"] == "prediction"
