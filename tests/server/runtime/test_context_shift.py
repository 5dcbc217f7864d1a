"""``--context-shift`` through a real server: a generation that fills the slot's context drops
``n_discard`` tokens after the first ``n_keep`` (upstream's choice of both) and goes on, reporting
``truncated``; what it generates after the shift is what the model gives for the shifted context
from scratch. Without the flag a full context ends the generation, as upstream's default does."""

from __future__ import annotations

import httpx
import pytest
from server_process import ServerProcess

N_CTX = 64


@pytest.fixture(scope="module")
def shifting(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", str(N_CTX), "-np", "1", "--context-shift")
    yield proc
    proc.stop()


def complete(server, **body) -> dict:
    r = httpx.post(server.url + "/completion", json={"temperature": 0, "ignore_eos": True, "return_tokens": True,
                                                     "cache_prompt": False, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def shifted_context(prompt: list[int], generated: list[int], n_keep: int, n_discard: int) -> list[int]:
    """The context at the first shift, as upstream chooses what goes (the prompt here has no BOS)."""
    context = (prompt + generated)[:N_CTX]
    keep = len(prompt) if n_keep < 0 else n_keep
    left = len(context) - keep
    drop = min(n_discard or left // 2, left - 1)
    return context[:keep] + context[keep + drop:]


@pytest.mark.parametrize("n_keep, n_discard", [(0, 0), (-1, 0), (4, 10)])
def test_a_full_context_shifts_and_generation_goes_on_from_the_shifted_context(shifting, n_keep, n_discard):
    prompt = list(range(5, 25))  # token ids: no BOS is added to a token prompt
    n_predict = N_CTX + 10  # more than the context holds
    out = complete(shifting, prompt=prompt, n_predict=n_predict, n_keep=n_keep, n_discard=n_discard)
    assert out["tokens_predicted"] == n_predict and out["truncated"] is True
    assert out["stop_type"] == "limit" and out["tokens_cached"] < N_CTX
    generated = out["tokens"]
    at = N_CTX - len(prompt)  # generated tokens in the context when it filled
    fresh = complete(shifting, prompt=shifted_context(prompt, generated, n_keep, n_discard), n_predict=4)
    assert fresh["tokens"] == generated[at:at + 4]


def test_n_keep_and_n_discard_are_range_checked(shifting):
    r = httpx.post(shifting.url + "/completion", json={"prompt": "a", "n_keep": -2}, timeout=60)
    assert r.status_code == 400 and "n_keep" in r.json()["error"]["message"]


def test_without_the_flag_a_full_context_ends_the_generation(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", str(N_CTX), "-np", "1")
    try:
        out = complete(proc, prompt=list(range(5, 25)), n_predict=N_CTX + 10)
        assert out["truncated"] is True and out["tokens_predicted"] == N_CTX - 20
    finally:
        proc.stop()


def test_a_speculating_request_shifts_and_decodes_plainly_after(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", str(N_CTX), "-np", "1", "--context-shift",
                         "--spec-type", "ngram-simple", "--keep", "4")
    try:
        props = httpx.get(proc.url + "/props", timeout=30).json()
        assert props["default_generation_settings"]["params"]["n_keep"] == 4  # --keep: the requests' default
        prompt = list(range(5, 15)) * 2  # repeats: prompt lookup has drafts to offer
        out = complete(proc, prompt=prompt, n_predict=2 * N_CTX)
        assert out["tokens_predicted"] == 2 * N_CTX and out["truncated"] is True
        assert out["timings"]["draft_kind"] == "prompt-lookup"  # the counters of the rounds before the shift
    finally:
        proc.stop()
