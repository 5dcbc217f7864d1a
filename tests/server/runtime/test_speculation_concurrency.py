"""Speculation at concurrency, through real server processes on tiny checkpoints: the speculating rows
of an iteration share one ragged verify forward (engine.cache.ragged), and every request still gets
exactly the tokens it gets alone, whatever runs beside it; a client that disconnects mid-round leaves
no slot busy and no cache corrupt."""

from __future__ import annotations

import threading
import time
from functools import partial

import httpx
import pytest
import tiny_checkpoints
import tiny_gguf
from concurrent_requests import concurrently, metric
from gguf import GGMLQuantizationType as Q
from server_process import ServerProcess, post_ok, running

pytestmark = pytest.mark.mlx_native  # also run under MLXCEL_KERNELS=mlx (make test)

PROMPTS = [
    "a b c d e f g a b c d e f g a b c d e f g a b c",
    "def f(x): return x + 1\ndef f(x): return x + 1\ndef f(x):",
    "The cat sat. The cat sat. The cat sat. The",
    "1 2 3 4 1 2 3 4 1 2 3 4 1 2",
    "x y z x y z x y z x y z x y",
    "red green blue red green blue red green",
    "one two three one two three one two three one",
    "if a: b\nif a: b\nif a: b\nif a:",
]
N = 32


@pytest.fixture(scope="module")
def draft_dir(checkpoints_root):
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-llama-draft-c", "llama", seed=3, layers=1)


@pytest.fixture(scope="module")
def target(tiny_llama_dir, checkpoints_root):
    # Q8_0 weights, so the forward runs on mlxcel's packed CPU kernels (what real GGUF models use here):
    # their rows round the same whatever else is in the forward, which OpenBLAS's float sgemm does not
    # promise (its row results depend on the matrix height), so the equality below is bitwise, sampled
    # rows included
    return tiny_gguf.write_gguf(tiny_llama_dir, checkpoints_root / "tiny-llama-q8.gguf", tiny_gguf.uniform(Q.Q8_0))


@pytest.fixture(scope="module")
def servers(target, draft_dir):
    common = ("-m", str(target), "-np", "8", "--metrics", "--slots", "-ub", "16")
    # no cost model: a speculating row drafts whatever its drafter proposes (up to n_max) in every
    # shared forward, whatever the machine's timings, so these tests verify the most blocks side by
    # side (the caps only change how many drafts a row brings: test_speculation_adaptive.py)
    off = {"MLXCEL_VERIFY_COST": "off"}
    with running(plain=partial(ServerProcess, *common),
                 lookup=partial(ServerProcess, *common, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m",
                                "6", env=off),
                 draft=partial(ServerProcess, *common, "-md", str(draft_dir), "--spec-draft-n-max", "3",
                               env=off)) as procs:
        yield procs


def body(i: int, prompt: str) -> dict:
    """Request ``i`` of the mix: every fourth one plain (speculation off for it), the others
    speculating; even ones greedy, odd ones sampled under their own seed."""
    fields = {"prompt": prompt, "n_predict": N, "ignore_eos": True, "return_tokens": True, "cache_prompt": False}
    if i % 4 == 0:
        fields["speculative.n_max"] = 0
    if i % 2:
        fields.update(temperature=0.8, seed=100 + i, top_k=0, top_p=1.0, min_p=0.0)
    else:
        fields["temperature"] = 0
    return fields


@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_eight_concurrent_requests_equal_each_alone(servers, kind):
    s = servers[kind]
    bodies = [body(i, p) for i, p in enumerate(PROMPTS)]
    alone = [post_ok(s, "/completion", b)["tokens"] for b in bodies]
    steps, rows = metric(s.url, "mlxcel:verify_steps_total"), metric(s.url, "mlxcel:verify_rows_total")
    together = concurrently(s.url, bodies)
    assert [r["tokens"] for r in together] == alone
    # the greedy ones are the plain server's tokens too (the plain server's batch decodes them)
    plain = concurrently(servers["plain"].url, [b for i, b in enumerate(bodies) if i % 2 == 0])
    assert [r["tokens"] for r in plain] == [a for i, a in enumerate(alone) if i % 2 == 0]
    # the speculating rows really shared forwards, and really drafted
    d_steps = metric(s.url, "mlxcel:verify_steps_total") - steps
    d_rows = metric(s.url, "mlxcel:verify_rows_total") - rows
    assert d_steps > 0 and d_rows / d_steps > 1.5, (d_steps, d_rows)
    assert sum(r["timings"].get("draft_rounds", 0) for r in together) > 0
    for i, r in enumerate(together):
        assert ("draft_rounds" in r["timings"]) == (i % 4 != 0 and r["timings"].get("draft_rounds", 0) > 0)


def wait_until_idle(url: str, slot: int, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while httpx.get(url + "/slots").json()[slot]["is_processing"]:
        assert time.monotonic() < deadline, "the slot stayed busy after the client disconnected"
        time.sleep(0.02)


def test_a_disconnect_mid_round_leaves_no_slot_busy_and_no_cache_corrupt(servers):
    s, fresh = servers["lookup"], servers["plain"]
    prompt = PROMPTS[0]
    # a neighbour keeps speculating in the same ragged batch while the other client goes away
    neighbour: list[dict] = []
    thread = threading.Thread(target=lambda: neighbour.append(post_ok(s, "/completion", {
        **body(2, PROMPTS[2]), "n_predict": 96})))
    thread.start()
    long = {"prompt": prompt, "n_predict": 100000, "ignore_eos": True, "stream": True, "id_slot": 5,
            "temperature": 0}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", s.url + "/completion", json=long) as r:
            chunks, step = 0, None
            for line in r.iter_lines():
                chunks += line.startswith("data: ")
                if chunks >= 3 and step is None:  # mid-run, /slots shows the row's last shared verify forward
                    step = httpx.get(s.url + "/slots").json()[5].get("speculative_step")
                    assert chunks < 60, "/slots showed no shared verify forward for the running row"
                if step is not None and chunks >= 6:
                    assert step["rows"] >= 1 and step["tokens"] >= step["rows"]
                    assert 0 <= step["accepted"] <= step["drafted"]
                    break
    wait_until_idle(s.url, 5)
    thread.join(timeout=120)
    assert neighbour and len(neighbour[0]["tokens"]) == 96
    alone = post_ok(fresh, "/completion", {**body(2, PROMPTS[2]), "n_predict": 96})["tokens"]
    assert neighbour[0]["tokens"] == alone
    # the next request on that slot reuses its cached prefix and gets what a fresh server gives
    follow = {"prompt": prompt + " d e", "n_predict": N, "ignore_eos": True, "return_tokens": True,
              "temperature": 0, "id_slot": 5, "cache_prompt": True}
    got = post_ok(s, "/completion", follow)
    assert got["timings"]["cache_n"] > 0
    assert got["tokens"] == post_ok(fresh, "/completion", {**follow, "id_slot": 1, "cache_prompt": False})["tokens"]
    assert not any(slot["is_processing"] for slot in httpx.get(s.url + "/slots").json())


def test_prompts_plain_rows_and_verify_blocks_share_one_forward_per_iteration(servers):
    # on a speculative server every row of this packed model joins the iteration's ragged forward:
    # no forward of the plain batch cache (each would count a decode call and no shared step), and
    # the prompts' tokens go through the shared forwards (prefilled together, chunk by chunk)
    s = servers["lookup"]
    bodies = [body(i, p) for i, p in enumerate(PROMPTS)]
    names = ("llamacpp:n_decode_total", "mlxcel:verify_steps_total", "mlxcel:verify_tokens_total")
    before = [metric(s.url, n) for n in names]
    together = concurrently(s.url, bodies)
    decodes, steps, tokens = (metric(s.url, n) - b for n, b in zip(names, before))
    assert 0 < decodes <= steps, (decodes, steps)
    assert tokens >= sum(r["timings"]["prompt_n"] + len(r["tokens"]) - 1 for r in together), tokens


def test_a_disconnect_mid_prompt_frees_the_slot_and_leaves_its_cache_exact(servers):
    s, fresh = servers["lookup"], servers["plain"]
    prompt = " ".join(f"w{i % 37}" for i in range(64))  # ~170 tokens: ten 16-token chunks (-ub 16)
    neighbour: list[dict] = []
    thread = threading.Thread(target=lambda: neighbour.append(post_ok(s, "/completion", {
        **body(1, PROMPTS[1]), "n_predict": 64})))
    thread.start()
    long = {"prompt": prompt, "n_predict": 8, "stream": True, "return_progress": True, "id_slot": 6,
            "temperature": 0, "cache_prompt": True}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", s.url + "/completion", json=long) as r:
            progress = 0
            for line in r.iter_lines():
                progress += "prompt_progress" in line
                if progress >= 3:  # a few chunks in: the client goes away mid-prompt
                    break
    wait_until_idle(s.url, 6)
    thread.join(timeout=120)
    assert neighbour and neighbour[0]["tokens"] == post_ok(s, "/completion", {**body(1, PROMPTS[1]),
                                                                               "n_predict": 64})["tokens"]
    # the slot kept the chunks it had prefilled; the same prompt again reuses them and gets a fresh server's tokens
    again = {"prompt": prompt, "n_predict": N, "ignore_eos": True, "return_tokens": True, "temperature": 0,
             "id_slot": 6, "cache_prompt": True}
    got = post_ok(s, "/completion", again)
    assert got["timings"]["cache_n"] > 0
    assert got["tokens"] == post_ok(fresh, "/completion", {**again, "id_slot": 2, "cache_prompt": False})["tokens"]
