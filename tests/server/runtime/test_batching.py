"""The scheduler under load, through a real server process: continuous batching must not change
results, a disconnected client frees its slot, the prompt cache is reused, stop strings stream
safely, and the openai client works against it."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from server_process import ServerProcess, sse_events

pytestmark = pytest.mark.mlx_native  # also run under MLXCEL_KERNELS=mlx (make test)

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Hello, world! How are",
    "Once upon a time there was",
    "import numpy as np",
    "The capital of France is Paris. The capital of",
    "class Stack:",
    "Speculative decoding proposes",
]


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "4", "--metrics", "-ub", "8")
    yield proc
    proc.stop()


def complete(url: str, prompt: str, **fields) -> dict:
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "ignore_eos": True, **fields}
    r = httpx.post(url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


async def stream_completion(client: httpx.AsyncClient, url: str, prompt: str, **fields) -> tuple[str, dict]:
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "ignore_eos": True, "stream": True, **fields}
    async with client.stream("POST", url + "/completion", json=body, timeout=120) as r:
        assert r.status_code == 200
        text = (await r.aread()).decode()
    events = [json.loads(e) for e in sse_events(text)]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    return "".join(e["content"] for e in events), events[-1]


def test_concurrent_streams_equal_alone(server):
    alone = {p: complete(server.url, p)["content"] for p in PROMPTS}
    sampled_alone = {p: complete(server.url, p, temperature=1.0, seed=7, top_k=0, top_p=1.0, min_p=0.0)["content"]
                     for p in PROMPTS}

    async def run(**fields):
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(stream_completion(client, server.url, p, **fields) for p in PROMPTS))

    before = decode_counts(server.url)  # the requests alone above decoded one row per step
    results = asyncio.run(run())
    for p, (content, final) in zip(PROMPTS, results):
        assert content == alone[p], p
        assert final["tokens_predicted"] == 12
    # seeded sampling draws by absolute position: batching does not change it either
    sampled = asyncio.run(run(temperature=1.0, seed=7, top_k=0, top_p=1.0, min_p=0.0))
    for p, (content, _) in zip(PROMPTS, sampled):
        assert content == sampled_alone[p], p
    decodes, rows = (b - a for a, b in zip(before, decode_counts(server.url)))
    assert decodes > 0 and rows / decodes > 1.5, ("decode steps were not batched", decodes, rows)


def decode_counts(url: str) -> tuple[float, float]:
    """The server's decode calls so far and the busy slots summed over them (from /metrics' mean)."""
    values = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(("llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode")):
            name, value = line.split()[:2]
            values[name] = float(value)
    decodes = values["llamacpp:n_decode_total"]
    return decodes, decodes * values["llamacpp:n_busy_slots_per_decode"]


def decode_rounds(url: str) -> int:
    text = httpx.get(url + "/metrics").text
    return int(float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("llamacpp:n_decode_total"))))


def test_disconnect_frees_slot(server):
    body = {"prompt": "Once upon a time", "n_predict": 100000, "ignore_eos": True, "stream": True, "id_slot": 3}
    before = decode_rounds(server.url)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", server.url + "/completion", json=body) as r:
            chunks = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks += 1
                if chunks >= 3:
                    break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        slots = httpx.get(server.url + "/slots").json()
        if not slots[3]["is_processing"]:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the slot stayed busy after the client disconnected")
    # it stopped early: far fewer decode rounds ran than the context allows (an idle slot reports
    # n_decoded 0, as upstream's, so the server's decode counter tells)
    decoded = decode_rounds(server.url) - before
    print("decode rounds before the disconnect took effect:", decoded)
    assert 3 <= decoded < 1000, decoded
    assert complete(server.url, "still alive")["tokens_predicted"] == 12


def test_prompt_cache_reuse(server):
    prompt = "The capital of France is Paris. The capital of Italy is"
    first = complete(server.url, prompt, id_slot=2, cache_prompt=True)
    second = complete(server.url, prompt, id_slot=2, cache_prompt=True)
    n = first["tokens_evaluated"]
    assert second["timings"]["cache_n"] == n - 1 and second["timings"]["prompt_n"] == 1
    assert second["content"] == first["content"]
    fresh = complete(server.url, prompt, id_slot=2, cache_prompt=False)
    assert fresh["timings"]["cache_n"] == 0 and fresh["content"] == first["content"]


def test_stop_string_streams_only_safe_text(server):
    base = complete(server.url, "Hello, world!", n_predict=16)["content"]
    stop = base[6:9]
    assert stop, base
    expected = base[: base.find(stop)]
    plain = complete(server.url, "Hello, world!", n_predict=16, stop=[stop])
    assert plain["content"] == expected and plain["stop_type"] == "word" and plain["stopping_word"] == stop

    async def go():
        async with httpx.AsyncClient() as client:
            return await stream_completion(client, server.url, "Hello, world!", n_predict=16, stop=[stop])

    streamed, final = asyncio.run(go())
    assert streamed == expected and final["stop_type"] == "word"


def test_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "Hello"}]
    chat = client.chat.completions.create(model="x", messages=messages, max_tokens=6, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens <= 6 and chat.choices[0].finish_reason in ("stop", "length")
    pieces = []
    for chunk in client.chat.completions.create(model="x", messages=messages, max_tokens=6, temperature=0,
                                                stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == chat.choices[0].message.content
    comp = client.completions.create(model="x", prompt="The quick", max_tokens=5, temperature=0)
    assert comp.choices[0].text == complete(server.url, "The quick", n_predict=5, ignore_eos=False)["content"]
