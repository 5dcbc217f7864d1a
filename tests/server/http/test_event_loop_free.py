"""A request's host-side preparation does not stall the other clients.

Tokenizing a long prompt (or rendering a template, compiling a grammar, building rerank prompts,
decoding a large JSON body) runs in a worker thread, not on the event loop: while one client's
multi-megabyte prompt is being tokenized, the server keeps answering everyone else. On the event
loop, no other request is answered until it is done.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from server_process import ServerProcess

# ~2.2 MB of text: the tiny BPE tokenizer needs well over a second for it on these cores
LONG_TEXT = "the quick brown fox jumps over the lazy dog " * 50_000
# a conversation of 150k short turns (~5 MB of JSON): validating and rendering it take seconds; the
# rendered prompt is then refused as past the context, before it is tokenized
MANY_TURNS = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(150_000)]
# 1500 documents to rerank (4.6 MB to tokenize, seconds), the last one past the context, so the
# request ends with a 400 once every prompt is built instead of scoring them all
DOCUMENTS = ["the quick brown fox jumps over the lazy dog " * 70] * 1500 + ["a lazy dog " * 1000]
# 1.5 million numbers in a field no route reads: decoding the 7.5 MB body takes seconds (every float is
# range-checked)
MANY_NUMBERS = [0.5] * 1_500_000


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "2", "--reranking")
    yield proc
    proc.stop()


def _answered_while(server, path: str, body: dict) -> tuple[float, list[float]]:
    """Send ``body`` to ``path`` while polling ``/health``; return the request's (start, end) span
    and the times at which health answers arrived."""
    answers: list[float] = []
    span: list[float] = []
    stop = threading.Event()

    def poll():
        with httpx.Client(base_url=server.url, timeout=30) as client:
            while not stop.is_set():
                assert client.get("/health").status_code == 200
                answers.append(time.monotonic())
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)
    span.append(time.monotonic())
    r = httpx.post(server.url + path, json=body, timeout=120)
    span.append(time.monotonic())
    stop.set()
    poller.join(30)
    assert r.status_code in (200, 400), r.text[:300]
    return span, answers


@pytest.mark.parametrize("path, body", [
    ("/tokenize", {"content": LONG_TEXT}),
    ("/v1/chat/completions", {"messages": MANY_TURNS, "max_tokens": 1}),  # the completion pipeline's plan
    ("/apply-template", {"messages": MANY_TURNS}),
    ("/rerank", {"query": "which fox?", "documents": DOCUMENTS}),
    ("/completion", {"prompt": "hi", "n_predict": 1, "unread": MANY_NUMBERS}),  # the body's JSON decode
], ids=["tokenize", "chat", "apply-template", "rerank", "json-body"])
def test_health_answers_while_a_long_prompt_is_tokenized(server, path, body):
    (start, end), answers = _answered_while(server, path, body)
    busy = end - start
    assert busy > 0.5, f"the request took {busy:.2f} s: too short to tell (make LONG_TEXT longer)"
    inside = [t for t in answers if start + 0.1 < t < end - 0.1]
    # on the event loop the tokenizer would block every answer for the whole span
    assert len(inside) >= 3, f"{len(inside)} health answers during a {busy:.2f} s request"
