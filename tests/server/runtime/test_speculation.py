"""Speculation inside the server, through real server processes on tiny checkpoints: the per-request
draft counters on every route and stream shape (and their absence), token-for-token equality with
a plain server, batch isolation, /metrics, and the command-line refusals."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import httpx
import pytest
import tiny_checkpoints
from server_process import ServerProcess, post_ok, run_server_command, running, sse_events

pytestmark = pytest.mark.mlx_native  # also run under MLXCEL_KERNELS=mlx (make test)

BASE_KEYS = ["cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
             "predicted_ms", "predicted_per_token_ms", "predicted_per_second"]
DRAFT_KEYS = ["draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"]
# Repetitive prompts, so prompt lookup has something to propose.
PROMPTS = [
    "a b c d e f g a b c d e f g a b c d e f g a b c",
    "def f(x): return x + 1\ndef f(x): return x + 1\ndef f(x):",
    "The cat sat. The cat sat. The cat sat. The",
    "1 2 3 4 1 2 3 4 1 2 3 4 1 2",
]
N = 24


@pytest.fixture(scope="module")
def draft_dir(checkpoints_root):
    # the same tokenizer as tiny-llama (build_tokenizer is deterministic), different weights and size
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-llama-draft", "llama", seed=3, layers=1)


@pytest.fixture(scope="module")
def servers(tiny_llama_dir, draft_dir):
    common = ("-m", str(tiny_llama_dir), "-np", "4", "--metrics", "-ub", "16")
    with running(plain=partial(ServerProcess, *common),
                 lookup=partial(ServerProcess, *common, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m",
                                "4"),
                 draft=partial(ServerProcess, *common, "-md", str(draft_dir), "--spec-draft-n-max", "3")) as procs:
        yield procs


def stream(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        text = r.read().decode()
    return [json.loads(e) for e in sse_events(text) if e != "[DONE]"]


def native(prompt: str, **fields) -> dict:
    return {"prompt": prompt, "n_predict": N, "temperature": 0, "ignore_eos": True, **fields}


def oai(prompt: str, **fields) -> dict:
    return {"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True, **fields}


def chat(prompt: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": N, "temperature": 0,
            "ignore_eos": True, **fields}


def check_counters(t: dict, kind: str, n_max: int) -> None:
    assert list(t)[:9] == BASE_KEYS
    assert list(t)[9:] == DRAFT_KEYS, t
    assert t["draft_kind"] == kind
    rounds, drafted, accepted = t["draft_rounds"], t["draft_n"], t["draft_n_accepted"]
    assert rounds >= 1 and 0 <= accepted <= drafted <= rounds * n_max
    mean_len = (accepted + rounds) / rounds  # tokens per verify round, recoverable from the block
    assert 1 <= mean_len <= n_max + 1
    # every round emits its accepted drafts plus one token; the first token comes from prefill
    assert t["predicted_n"] >= 1 + accepted + rounds


def no_counters(t: dict) -> None:
    assert list(t) == BASE_KEYS, t


# -- counters on every route and stream shape ----------------------------------------------------


@pytest.mark.parametrize("kind,n_max", [("lookup", 4), ("draft", 3)])
def test_counters_on_every_route(servers, kind, n_max):
    s = servers[kind]
    name = "prompt-lookup" if kind == "lookup" else "draft-model"
    p = PROMPTS[0]
    for path in ("/completion", "/completions"):
        check_counters(post_ok(s, path, native(p))["timings"], name, n_max)
    check_counters(post_ok(s, "/v1/completions", oai(p))["timings"], name, n_max)
    check_counters(post_ok(s, "/v1/chat/completions", chat(p))["timings"], name, n_max)

    # native stream: only the final event carries the counters; per-token frames the nine base keys
    events = stream(s, "/completion", native(p, timings_per_token=True))
    check_counters(events[-1]["timings"], name, n_max)
    for e in events[:-1]:
        no_counters(e["timings"])
    # chat stream: only the finish_reason chunk carries timings, with the counters
    chunks = stream(s, "/v1/chat/completions", chat(p))
    with_timings = [c for c in chunks if "timings" in c]
    assert len(with_timings) == 1 and with_timings[0]["choices"][0]["finish_reason"] == "length"
    check_counters(with_timings[0]["timings"], name, n_max)
    # include_usage: the usage chunk carries them
    chunks = stream(s, "/v1/chat/completions", chat(p, stream_options={"include_usage": True}))
    with_timings = [c for c in chunks if "timings" in c]
    assert len(with_timings) == 1 and "usage" in with_timings[0]
    check_counters(with_timings[0]["timings"], name, n_max)
    # OpenAI completions stream: the final chunk
    chunks = stream(s, "/v1/completions", oai(p))
    with_timings = [c for c in chunks if "timings" in c]
    assert len(with_timings) == 1
    check_counters(with_timings[0]["timings"], name, n_max)


def test_counters_absent_without_a_verify_round(servers):
    p = PROMPTS[0]
    no_counters(post_ok(servers["plain"], "/completion", native(p))["timings"])
    no_counters(post_ok(servers["plain"], "/v1/chat/completions", chat(p))["timings"])
    for kind in ("lookup", "draft"):
        s = servers[kind]
        # finished inside prefill: the only token came from the prefill logits
        no_counters(post_ok(s, "/completion", native(p, n_predict=1))["timings"])
        # a request that opts out of speculation
        no_counters(post_ok(s, "/completion", native(p, **{"speculative.n_max": 0}))["timings"])
        no_counters(post_ok(s, "/v1/chat/completions", chat(p, **{"speculative.n_max": 0}))["timings"])
        # token probabilities are produced by plain steps only
        no_counters(post_ok(s, "/completion", native(p, n_probs=2))["timings"])


def test_per_request_block_cap(servers):
    t = post_ok(servers["lookup"], "/completion", native(PROMPTS[0], **{"speculative.n_max": 2}))["timings"]
    check_counters(t, "prompt-lookup", 2)


# -- equality with the plain server ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_temperature_zero_output_equals_the_plain_server_on_every_route(servers, kind):
    plain, spec = servers["plain"], servers[kind]
    for p in PROMPTS:
        for path, body in (("/completion", native(p)), ("/v1/completions", oai(p))):
            a, b = post_ok(plain, path, body), post_ok(spec, path, body)
            key = "content" if path == "/completion" else "choices"
            assert a[key] == b[key] if key == "content" else a[key][0]["text"] == b[key][0]["text"], (path, p)
        a = post_ok(plain, "/v1/chat/completions", chat(p))["choices"][0]["message"]["content"]
        b = post_ok(spec, "/v1/chat/completions", chat(p))["choices"][0]["message"]["content"]
        assert a == b
        a = "".join(e["content"] for e in stream(plain, "/completion", native(p, return_tokens=True)))
        b = "".join(e["content"] for e in stream(spec, "/completion", native(p, return_tokens=True)))
        assert a == b
        toks_a = post_ok(plain, "/completion", native(p, return_tokens=True))["tokens"]
        toks_b = post_ok(spec, "/completion", native(p, return_tokens=True))["tokens"]
        assert toks_a == toks_b and len(toks_a) == N


@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_sampled_output_equals_the_plain_server_under_the_same_seed(servers, kind):
    # sampler-match emits the target's own position-keyed draw: the same tokens as plain decoding.
    # At temperature 0.7 (seed 11) the first prompt's sampled stream repeats enough of it for prompt
    # lookup to verify drafts, so the equality is tested on drafted rounds, not plain steps.
    fields = dict(temperature=0.7, seed=11, top_k=0, top_p=1.0, min_p=0.0, return_tokens=True)
    drafted = 0
    for p in PROMPTS[:2]:
        a = post_ok(servers["plain"], "/completion", native(p, **fields))
        b = post_ok(servers[kind], "/completion", native(p, **fields))
        assert a["tokens"] == b["tokens"]
        drafted += b["timings"].get("draft_rounds", 0)
        assert kind == "lookup" or "draft_rounds" in b["timings"]
    assert drafted > 0  # the drafter really drafted: the comparison covered verify rounds


def test_stop_inside_a_verified_block_and_prompt_reuse_afterwards(servers):
    plain, spec = servers["plain"], servers["lookup"]
    p = PROMPTS[2]
    full = post_ok(plain, "/completion", native(p))["content"]
    stop = full.strip()[3:6] or full[:2]
    a = post_ok(plain, "/completion", native(p, stop=[stop], id_slot=1))
    b = post_ok(spec, "/completion", native(p, stop=[stop], id_slot=1))
    assert (a["content"], a["stop_type"]) == (b["content"], b["stop_type"])
    # the slot's cache was trimmed back to what was kept: reusing it gives the same output again
    b2 = post_ok(spec, "/completion", native(p + " x", id_slot=1))
    a2 = post_ok(plain, "/completion", native(p + " x", id_slot=1))
    assert b2["timings"]["cache_n"] > 0 and a2["content"] == b2["content"]


# -- batch isolation ------------------------------------------------------------------------------


def test_a_speculating_row_beside_plain_rows_leaves_them_unchanged(servers):
    plain, spec = servers["plain"], servers["lookup"]
    alone = [post_ok(plain, "/completion", native(p, return_tokens=True))["tokens"] for p in PROMPTS]

    async def run():
        async with httpx.AsyncClient() as client:
            async def one(i, p):
                fields = {} if i == 0 else {"speculative.n_max": 0}  # row 0 speculates, the rest are plain
                r = await client.post(spec.url + "/completion", json=native(p, return_tokens=True, **fields),
                                      timeout=120)
                return r.json()
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))

    results = asyncio.run(run())
    assert "draft_rounds" in results[0]["timings"]
    for r in results[1:]:
        no_counters(r["timings"])
    assert [r["tokens"] for r in results] == alone


# -- metrics --------------------------------------------------------------------------------------


def metric_values(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_expose_the_speculative_counters(servers):
    s = servers["lookup"]
    before = metric_values(httpx.get(s.url + "/metrics").text)
    t = post_ok(s, "/completion", native(PROMPTS[3]))["timings"]
    after = metric_values(httpx.get(s.url + "/metrics").text)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta("llamacpp:spec_decode_num_draft_tokens_total") == t["draft_n"]
    assert delta("llamacpp:spec_decode_num_accepted_tokens_total") == t["draft_n_accepted"]
    assert delta("llamacpp:spec_decode_num_drafts_total") == t["draft_rounds"]
    assert delta('mlxcel:spec_decode_rounds_total{draft_kind="prompt-lookup"}') == t["draft_rounds"]
    per_pos = [v for k, v in after.items() if k.startswith("llamacpp:spec_decode_num_accepted_tokens_per_pos_total")]
    assert sum(per_pos) == after["llamacpp:spec_decode_num_accepted_tokens_total"]
    assert per_pos == sorted(per_pos, reverse=True)  # a draft is accepted only after all before it
    plain = metric_values(httpx.get(servers["plain"].url + "/metrics").text)
    assert plain["llamacpp:spec_decode_num_drafts_total"] == 0


# -- command line ---------------------------------------------------------------------------------


def test_impossible_speculative_command_lines_are_refused(tmp_path):
    dflash = tmp_path / "dflash"
    dflash.mkdir()
    (dflash / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["DFlashDraftModel"],
                                                    "dflash_config": {"block_size": 16}}))
    for args, needle in (((("--spec-type", "draft-simple", "-md", str(dflash))), "dflash drafter checkpoint"),
                         (("--spec-type", "draft-eagle3"), "draft-eagle3 needs its drafter"),
                         (("--draft-kind", "dspark"), "pass -md DIR"),
                         (("--draft-kind", "dspark", "-md", str(dflash)), "dspark was asked for"),
                         (("--spec-type", "draft-simple"), "needs a draft model"),
                         (("--spec-type", "ngram-simple,draft-simple", "-md", "x.gguf"), "one drafter at a time"),
                         (("--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "0"), "at least 1"),
                         (("--spec-type", "ngram-cache,draft-simple", "-md", "x.gguf"), "only the n-gram types combine"),
                         (("--spec-type", "ngram-cache", "-lcs", str(tmp_path / "none.bin")), "no such file"),
                         (("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "0"), "between 1 and 1024"),
                         (("--spec-ngram-map-k4v-min-hits", "0"), "must be at least 1"),
                         (("-md", "x.gguf", "--spec-synth-rates", "1,1"), "must contain 3 values"),
                         (("-md", "x.gguf", "--spec-synth-rates", "0.5,0.9,0.1"), "non-increasing"),
                         (("-md", "x.gguf", "--spec-synth-len", "9"), "within [1, 4]"),
                         (("-md", "x.gguf", "--spec-synth-len", "2", "--spec-synth-rates", "1,1,1"),
                          "mutually exclusive")):
        r = run_server_command(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_synthetic_acceptance_accepts_at_the_set_rate(servers, tiny_llama_dir, draft_dir):
    """llama-server's benchmarking flags start the server: at rate 1 every draft is accepted, at rate 0
    none is and the output is the plain server's."""
    common = ("-m", str(tiny_llama_dir), "-np", "1", "-md", str(draft_dir))
    body = native("The quick brown fox", n_predict=16, temperature=0, ignore_eos=True, return_tokens=True)
    with running(all_=partial(ServerProcess, *common, "--spec-synth-rates", "1,1,1"),
                 none=partial(ServerProcess, *common, "--spec-synth-len", "1")) as procs:
        t = post_ok(procs["all_"], "/completion", body)["timings"]
        assert t["draft_n_accepted"] == t["draft_n"] > 0
        none = post_ok(procs["none"], "/completion", body)
        assert none["timings"]["draft_n_accepted"] == 0 and none["timings"]["draft_n"] > 0
        assert none["tokens"] == post_ok(servers["plain"], "/completion", body)["tokens"]
        assert "synthetic speculative acceptance is on" in procs["none"].log()


# -- predicted outputs (OpenAI's prediction field) ------------------------------------------------


PREDICTION_KIND = {"plain": "prediction", "lookup": "prediction+prompt-lookup", "draft": "prediction+draft-model"}


def predicted(text: str) -> dict:
    return {"prediction": {"type": "content", "content": text}}


def tokenized(server, text: str) -> list[int]:
    return post_ok(server, "/tokenize", {"content": text, "parse_special": False})["tokens"]


@pytest.mark.parametrize("kind", ["plain", "lookup", "draft"])
@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.7, seed=11, top_k=0, top_p=1.0,
                                                                  min_p=0.0)], ids=["greedy", "seeded"])
def test_a_prediction_drafts_on_every_server_and_the_output_is_the_plain_servers(servers, kind, sampling):
    """The prediction is a draft source alone (no drafter) or ahead of the server's own; whatever it
    holds (the answer itself, the answer edited in the middle, something else) the tokens are the ones
    the plain server writes without it."""
    p = PROMPTS[3]  # the tiny model's answer re-tokenizes into much of itself here (random weights write odd bytes)
    want = post_ok(servers["plain"], "/completion", native(p, return_tokens=True, **sampling))
    text = want["content"]
    edited = text[:len(text) // 3] + "edit here" + text[len(text) // 2:]
    rounds = 0
    for prediction in (text, edited, "The quick brown fox."):
        got = post_ok(servers[kind], "/completion", native(p, return_tokens=True, **sampling, **predicted(prediction)))
        assert got["tokens"] == want["tokens"], prediction
        total = got["accepted_prediction_tokens"] + got["rejected_prediction_tokens"]
        assert total == len(tokenized(servers[kind], prediction))
        if "draft_rounds" in got["timings"]:
            rounds += got["timings"]["draft_rounds"]
            assert got["timings"]["draft_kind"] == PREDICTION_KIND[kind]
    assert rounds > 0
    first = post_ok(servers[kind], "/completion", native(p, **sampling, **predicted(text)))
    assert first["timings"]["draft_kind"] == PREDICTION_KIND[kind] and first["timings"]["draft_n_accepted"] > 0


def test_prediction_counts_on_every_route_and_stream_shape(servers):
    s, p = servers["plain"], PROMPTS[0]
    out = post_ok(s, "/completion", native(p, return_tokens=True))
    wrong = "Zebra quilts vex."  # none of its tokens is in this output (checked): a known count
    assert not set(tokenized(s, wrong)) & set(out["tokens"])
    n_wrong = len(tokenized(s, wrong))
    known = {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": n_wrong}
    native_body = post_ok(s, "/completion", native(p, **predicted(wrong)))
    assert {k: native_body[k] for k in known} == known
    assert "accepted_prediction_tokens" not in out  # only a request with a prediction reports them
    events = stream(s, "/completion", native(p, **predicted(wrong)))
    assert {k: events[-1][k] for k in known} == known
    details = {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": n_wrong}
    assert post_ok(s, "/v1/completions", oai(p, **predicted(wrong)))["usage"]["completion_tokens_details"] == details
    chunks = stream(s, "/v1/completions", oai(p, **predicted(wrong)))
    assert chunks[-1]["usage"]["completion_tokens_details"] == details
    parts = {"prediction": {"type": "content", "content": [{"type": "text", "text": "Zebra "},
                                                           {"type": "text", "text": "quilts vex."}]}}
    body = post_ok(s, "/v1/chat/completions", chat(p, **parts))
    assert body["usage"]["completion_tokens_details"] == details
    assert "completion_tokens_details" not in post_ok(s, "/v1/chat/completions", chat(p))["usage"]
    chunks = stream(s, "/v1/chat/completions", chat(p, stream_options={"include_usage": True}, **parts))
    (usage,) = [c for c in chunks if "usage" in c]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens_details"] == details


def test_a_prediction_on_a_request_that_decodes_plainly_is_still_counted(servers):
    s, p = servers["lookup"], PROMPTS[0]
    text = post_ok(s, "/completion", native(p))["content"]
    for opt_out in ({"n_probs": 2}, {"speculative.n_max": 0}, {"speculative.type": "none"}):
        got = post_ok(s, "/completion", native(p, **opt_out, **predicted(text)))
        no_counters(got["timings"])
        assert got["content"] == text and got["accepted_prediction_tokens"] > 0
