"""EAGLE-3 through both entry points: ``mlxcel generate`` (its real ``main``, in process) and a real
``mlxcel-server`` process started with ``--spec-type draft-eagle3 -md DIR``.

* temperature 0: the text / tokens equal plain greedy decoding; the CLI's acceptance line names
  the greedy rule, the server's timings ``draft_kind: "eagle3"`` on every route and stream shape;
* above temperature 0 the rule is sampler-match (on the CLI's line and in the server's log), and the
  tokens are plain sampling's under the same seed; ``speculative.stochastic_accept: true`` switches
  one request to modified rejection sampling;
* two slots at once, one speculating and one not, each get their own greedy tokens (the drafter's
  row runs alongside a plain row);
* startup names the drafter and its block; /props-style settings answer ``draft-eagle3``.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from concurrent_requests import concurrently
from server_process import ServerProcess, post_ok, sse_events
from target_only import target_only_tokens

from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.cli import generate

N = 20
TEXTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "def add(a, b):\n    return a + b\n"]
DRAFT_KEYS = ["draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"]
HOT = dict(temperature=20.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)  # the tiny target is very peaked


def generated(capsys, target_dir, *flags) -> tuple[str, str]:
    argv = ["-m", str(target_dir), "-p", TEXTS[0], "-n", str(N), "--no-chat-template", "--ignore-eos", *flags]
    assert generate.main(argv) == 0
    out = capsys.readouterr().out
    return out.split("[Performance]")[0], out


def test_mlxcel_generate_runs_eagle3(e3_target_dir, e3_dirs, capsys, monkeypatch):
    monkeypatch.setenv("MLXCEL_EXACTNESS_PROBE", "pass")
    plain, _ = generated(capsys, e3_target_dir, "--temp", "0")
    text, out = generated(capsys, e3_target_dir, "--temp", "0", "--spec-type", "draft-eagle3", "-md",
                          str(e3_dirs["echo"]))
    assert text == plain
    m = re.search(r"^\[Speculative acceptance\] rule=greedy-argmax rounds=(\d+) proposed=\d+ positions_tested=\d+ "
                  r"accepted=(\d+) ", out, re.M)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0
    sampled = ("--temp", "20", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "7")
    plain, _ = generated(capsys, e3_target_dir, *sampled)
    text, out = generated(capsys, e3_target_dir, *sampled, "--draft-kind", "eagle3", "-md", str(e3_dirs["gguf"]))
    assert text == plain
    assert re.search(r"^\[Speculative acceptance\] rule=sampler-match rounds=[1-9]", out, re.M)


@pytest.fixture(scope="module")
def server(e3_target_dir, e3_dirs):
    proc = ServerProcess("-m", str(e3_target_dir), "-np", "2", "-ub", "16", "--spec-type", "draft-eagle3",
                         "-md", str(e3_dirs["echo"]), env={"MLXCEL_EXACTNESS_PROBE": "pass"})
    try:
        yield proc
    finally:
        proc.stop()


def native(prompt, **fields):
    return {"prompt": prompt, "n_predict": N, "temperature": 0, "ignore_eos": True, "return_tokens": True, **fields}


def check_timings(t: dict) -> None:
    assert [k for k in t if k in DRAFT_KEYS] == DRAFT_KEYS, t
    assert t["draft_kind"] == "eagle3" and t["draft_rounds"] >= 1
    assert 0 <= t["draft_n_accepted"] <= t["draft_n"]


def stream(server, path, body):
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=180) as r:
        assert r.status_code == 200
        return [json.loads(e) for e in sse_events(r.read().decode()) if e != "[DONE]"]


def log_count(server, needle: str) -> int:
    return server.log_path.read_text(errors="replace").count(needle)


def test_temperature_zero_serves_greedy_tokens_with_eagle3_timings(server, e3_target):
    greedy = SamplerParams(temperature=0.0, ignore_eos=True)
    accepted = 0
    for text in TEXTS:
        prompt = list(e3_target.tokenizer.encode(text))
        body = post_ok(server, "/completion", native(prompt))
        assert body["tokens"] == target_only_tokens(e3_target, prompt, greedy, N), text
        check_timings(body["timings"])
        accepted += body["timings"]["draft_n_accepted"]
    assert accepted > 0  # the echo drafter's drafts reach the verify rounds and some are taken
    chat = {"messages": [{"role": "user", "content": TEXTS[0]}], "max_tokens": N, "temperature": 0,
            "ignore_eos": True}
    check_timings(post_ok(server, "/v1/chat/completions", chat)["timings"])
    check_timings(stream(server, "/completion", native(TEXTS[0]))[-1]["timings"])
    chunks = [c for c in stream(server, "/v1/chat/completions", chat) if "timings" in c]
    assert len(chunks) == 1
    check_timings(chunks[0]["timings"])
    assert post_ok(server, "/completion", native(TEXTS[1]))["generation_settings"]["speculative.types"] == \
        "none,draft-eagle3"


def test_sampling_is_sampler_match_unless_the_request_opts_in(server, e3_target):
    prompt = list(e3_target.tokenizer.encode(TEXTS[1]))
    before = log_count(server, "rule=sampler-match")
    body = post_ok(server, "/completion", native(prompt, **HOT))
    assert log_count(server, "rule=sampler-match") == before + 1
    expected = target_only_tokens(e3_target, prompt, SamplerParams(ignore_eos=True, **HOT), N)
    assert body["tokens"] == expected  # plain sampling's tokens, drafted or not
    assert expected != target_only_tokens(e3_target, prompt, SamplerParams(temperature=0.0, ignore_eos=True), N)
    check_timings(body["timings"])
    before = log_count(server, "rule=stochastic")
    body = post_ok(server, "/completion", native(prompt, **HOT, **{"speculative.stochastic_accept": True}))
    assert log_count(server, "rule=stochastic") == before + 1
    check_timings(body["timings"])


def test_a_speculating_row_and_a_plain_row_at_once(server, e3_target):
    greedy = SamplerParams(temperature=0.0, ignore_eos=True)
    prompts = [list(e3_target.tokenizer.encode(t)) for t in TEXTS]
    bodies = [native(prompts[0], n_predict=40), native(prompts[1], n_predict=40, **{"speculative.n_max": 0})]
    drafted, plain = concurrently(server.url, bodies)
    assert drafted["tokens"] == target_only_tokens(e3_target, prompts[0], greedy, 40)
    assert plain["tokens"] == target_only_tokens(e3_target, prompts[1], greedy, 40)
    check_timings(drafted["timings"])
    assert "draft_kind" not in plain["timings"]


def test_a_constrained_request_drafts_within_its_grammar(server):
    """The drafter masks each row with what the grammar allows (and stops where nothing in its draft
    vocabulary is allowed); the output keeps to the grammar and the rounds still run."""
    body = post_ok(server, "/completion", native(TEXTS[0], grammar='root ::= [a-z ]+', n_predict=12))
    assert re.fullmatch(r"[a-z ]+", body["content"]), body["content"]
    check_timings(body["timings"])


def test_startup_names_the_drafter_and_its_block(server):
    log = server.log_path.read_text(errors="replace")
    assert "Drafter loaded: eagle3" in log and "block 3" in log and "reads target layers [0, 1, 3]" in log
