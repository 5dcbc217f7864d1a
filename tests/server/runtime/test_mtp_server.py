"""The MTP drafter inside the server, through real server processes on tiny checkpoints: the
target's own MTP layer (``--draft-kind mtp``) and a separate NextN assistant (``--spec-type
draft-mtp -md DIR``) serve requests whose output at temperature 0 equals a plain server's, token
for token, with ``draft_kind: "mtp"`` in the timings of every route."""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import tiny_mtp
from server_process import ServerProcess, post_ok, run_server_command, running, sse_events

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "Hello, world! How are you"]
N = 24


@pytest.fixture(scope="module")
def target_dir(checkpoints_root):
    # an echo MTP layer: it predicts what the target predicted one step earlier, which the tiny
    # target's looping greedy stream accepts, so accepted drafts go through the server's rows
    return tiny_mtp.build_glm_target(checkpoints_root / "tiny-glm-mtp", echo=True)


@pytest.fixture(scope="module")
def assistant_dir(checkpoints_root, target_dir):
    return tiny_mtp.build_nextn_assistant(checkpoints_root / "tiny-glm-mtp-nextn", target_dir)


@pytest.fixture(scope="module")
def servers(target_dir, assistant_dir):
    common = ("-m", str(target_dir), "-np", "2", "-ub", "16")
    with running(plain=partial(ServerProcess, *common),
                 internal=partial(ServerProcess, *common, "--draft-kind", "mtp", "--spec-draft-n-max", "3"),
                 assistant=partial(ServerProcess, *common, "--spec-type", "draft-mtp", "-md", str(assistant_dir),
                                   "--spec-draft-n-max", "3")) as procs:
        yield procs


def native(prompt: str, **fields) -> dict:
    return {"prompt": prompt, "n_predict": N, "temperature": 0, "ignore_eos": True, **fields}


def chat(prompt: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": N, "temperature": 0,
            "ignore_eos": True, **fields}


def check_mtp(timings: dict) -> None:
    assert timings["draft_kind"] == "mtp"
    assert timings["draft_rounds"] > 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]


@pytest.mark.parametrize("variant", ["internal", "assistant"])
def test_temperature_zero_equals_the_plain_server(servers, variant):
    s = servers[variant]
    accepted = 0
    for p in PROMPTS:
        a = post_ok(servers["plain"], "/completion", native(p))
        b = post_ok(s, "/completion", native(p))
        assert b["content"] == a["content"]
        assert b["tokens_predicted"] == a["tokens_predicted"] == N
        check_mtp(b["timings"])
        accepted += b["timings"]["draft_n_accepted"]
        a = post_ok(servers["plain"], "/v1/chat/completions", chat(p))
        b = post_ok(s, "/v1/chat/completions", chat(p))
        assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
        check_mtp(b["timings"])
    assert accepted > 0


def test_stream_and_openai_completion_report_mtp(servers):
    s = servers["internal"]
    check_mtp(post_ok(s, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": N, "temperature": 0,
                                          "ignore_eos": True})["timings"])
    with httpx.stream("POST", s.url + "/completion", json={**native(PROMPTS[0]), "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        events = [json.loads(e) for e in sse_events(r.read().decode()) if e != "[DONE]"]
    check_mtp(events[-1]["timings"])
    text = "".join(e.get("content", "") for e in events)
    assert text == post_ok(servers["plain"], "/completion", native(PROMPTS[0]))["content"]


def test_a_sampled_request_is_served(servers):
    body = native(PROMPTS[1], temperature=0.8, seed=5)
    b = post_ok(servers["internal"], "/completion", body)
    assert b["tokens_predicted"] == N
    check_mtp(b["timings"])


def test_targets_the_mtp_kind_cannot_serve_are_refused_at_startup(tiny_llama_dir, target_dir, checkpoints_root):
    """No MTP layers in the target; a -md that is not an MTP assistant: one error line each, no
    traceback, a failed exit. (Hybrid targets are served: tests/server/runtime/test_hybrid_server.py.)"""
    for args, needle in (((("-m", str(tiny_llama_dir), "--draft-kind", "mtp")), "has no MTP layers"),
                         (("-m", str(target_dir), "--spec-type", "draft-mtp", "-md", str(tiny_llama_dir)),
                          "not a NextN MTP assistant")):
        r = run_server_command(*args, "--port", "0")
        assert r.returncode != 0, (args, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
