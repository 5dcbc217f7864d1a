"""A corpus of bad requests, sent to a real server on every route: each gets a 4xx with
llama-server's error body (``{"error": {"code", "message", "type"}}``), never a 5xx, and a normal
request right after it still succeeds. The limits flags (--max-body-size, --max-prompt-tokens, -n)
are exercised here too.

Run alone: ``./scripts/with-blas .venv/bin/python -m pytest -q tests/server/http/test_bad_input.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest
from server_process import ServerProcess

N_CTX = 128  # each slot's context (-c is N_CTX * SLOTS: upstream splits -c among the slots)
MAX_BODY = 200_000
MAX_PROMPT = 100
SLOTS = 2
VOCAB = 384  # tests/helpers/tiny_checkpoints.py

COMPLETION_ROUTES = ["/completion", "/completions", "/v1/completions"]
CHAT_ROUTES = ["/v1/chat/completions", "/chat/completions"]
JSON_ROUTES = [*COMPLETION_ROUTES, *CHAT_ROUTES, "/tokenize", "/detokenize", "/apply-template",
               "/v1/chat/completions/input_tokens"]
USER = [{"role": "user", "content": "hi"}]


@dataclass
class Case:
    id: str
    path: str
    body: bytes | dict | None
    status: int = 400
    type: str = "invalid_request_error"
    method: str = "POST"
    headers: dict | None = None

    def content(self) -> bytes | None:
        if self.body is None or isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body).encode()


def base(path: str) -> dict:
    """A valid body for ``path`` (a bad field is then added to it)."""
    if path in COMPLETION_ROUTES:
        return {"prompt": "hi", "n_predict": 1}
    if path in CHAT_ROUTES:
        return {"messages": USER, "max_tokens": 1}
    if path in ("/apply-template", "/v1/chat/completions/input_tokens"):
        return {"messages": USER}
    return {}


MALFORMED = {
    "empty": b"",
    "whitespace": b"   \n",
    "truncated": b'{"prompt": "hi", "n_predict": 4',
    "trailing-comma": b'{"prompt": "hi",}',
    "single-quotes": b"{'prompt': 'hi'}",
    "trailing-garbage": b'{"prompt": "hi"} x',
    "array-body": b"[1, 2, 3]",
    "string-body": b'"hello"',
    "null-body": b"null",
    "number-body": b"42",
    "invalid-utf8": b'{"prompt": "\xff\xfe\xfd"}',
    "nan-literal": b'{"prompt": "hi", "temperature": NaN}',
    "infinity-literal": b'{"prompt": "hi", "top_p": -Infinity}',
    "float-overflow": b'{"prompt": "hi", "temperature": 1e400}',
    "int-too-long": b'{"prompt": "hi", "seed": ' + b"9" * 5000 + b"}",
    "deep-array": b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
    "deep-object": b'{"a": ' + b'{"a": ' * 80 + b"1" + b"}" * 80 + b"}",
}

# SamplingFields and friends: a wrong-typed value for each, as upstream checks them
WRONG_TYPES = {
    "n_predict": "four", "max_tokens": "ten", "temperature": "hot", "dynatemp_range": [], "dynatemp_exponent": {},
    "top_k": "k", "top_p": True, "min_p": "x", "top_n_sigma": "x", "typical_p": [1], "xtc_probability": "x",
    "xtc_threshold": {}, "repeat_last_n": 1.5, "repeat_penalty": "x", "presence_penalty": [], "frequency_penalty": "x",
    "dry_multiplier": "x", "dry_base": False, "dry_allowed_length": "2", "dry_penalty_last_n": 2.5,
    "dry_sequence_breakers": "\n", "mirostat": "2", "mirostat_tau": "x", "mirostat_eta": [], "adaptive_target": "x",
    "adaptive_decay": {}, "ignore_eos": "yes", "seed": "42", "stop": 5, "n_probs": "3", "min_keep": "1",
    "n_keep": "1", "n_discard": [], "post_sampling_probs": 1, "cache_prompt": "true", "id_slot": "0",
    "return_tokens": 0, "return_progress": "no", "response_fields": "content", "timings_per_token": 1,
    "stream": "yes", "stream_options": "x", "samplers": 5, "speculative.n_max": "8", "speculative.n_min": [],
    "grammar": 5, "n_cmpl": "2", "n": "2", "logit_bias": "abc", "lora": 5, "response_format": 5,
}
CHAT_WRONG_TYPES = {
    "logprobs": "yes", "top_logprobs": "3", "max_completion_tokens": "x", "verbose": "x",
    "chat_template_kwargs": [], "add_generation_prompt": "x",
}

OUT_OF_RANGE = {
    "/completion": [
        ("n_predict", -2), ("n_predict", 2**31), ("n_predict", 1e300), ("n_probs", -1), ("n_probs", 1025),
        ("n_cmpl", 0), ("n_cmpl", SLOTS + 1), ("n_cmpl", -3), ("top_k", 2**40), ("repeat_last_n", -2),
        ("dry_allowed_length", -1), ("dry_penalty_last_n", -5), ("speculative.n_max", -1),
        ("speculative.n_min", -1), ("seed", 1.5), ("id_slot", 0.5), ("n_predict", 3.5),
        ("dry_sequence_breakers", []), ("mirostat", 2), ("top_n_sigma", 1.0), ("dynatemp_range", 0.5),
        ("adaptive_target", 0.5), ("grammar", "root ::= x"), ("json_schema", {"type": "hiccup"}),
        ("json_schema", "not a schema"), ("response_format", {"type": "sound"}),
        ("response_format", {"type": "json_object", "schema": {"type": 123}}),
        ("samplers", ["temperature", "top_k"]), ("samplers", ["bogus"]), ("samplers", "kq"),
        ("lora", [{"id": 0, "scale": 1.0}]), ("lora", [1]),
    ],
    "/v1/completions": [
        ("n", 0), ("n", 99), ("logprobs", -1), ("logprobs", 1025), ("max_tokens", -7), ("max_tokens", 2**33),
    ],
    "/v1/chat/completions": [
        ("n", 0), ("n", SLOTS + 1), ("max_tokens", -2), ("max_completion_tokens", 2**31),
        ("max_tokens", 1e300),
    ],
}

PROMPTS = [
    ("empty-token-list", []), ("null", None), ("number", 123), ("boolean", True), ("nested-lists", [[[1]]]),
    ("object-without-prompt-string", {"text": "hi"}), ("object-prompt-string-number", {"prompt_string": 5}),
    ("token-at-vocab", [VOCAB]), ("token-negative", [-1]), ("token-huge", [2**40]), ("token-float", [1.5]),
    ("mixed-with-null", ["hi", None]), ("list-of-prompts-with-bad", ["hi", 5.5]), ("empty-string", ""),
    ("mixed-bad-token", ["hi", VOCAB + 5]), ("too-many-prompts", ["hi"] * 5000),
]

LOGIT_BIAS = [
    ("string", "abc"), ("pair-too-short", [[1]]), ("pair-too-long", [[1, 2, 3]]), ("flat-list", [1, 2]),
    ("bias-string", [[1, "x"]]), ("bias-null", [[1, None]]), ("bias-true", [[1, True]]), ("token-bool", [[True, 1]]),
    ("token-null", [[None, 1]]), ("token-object", [[{}, 1]]), ("object-bias-string", {"1": "x"}),
    ("object-bias-list", {"1": [1]}), ("number", 5),
]

MESSAGES = [
    ("role-number", [{"role": 123, "content": "x"}]), ("role-missing", [{"content": "x"}]),
    ("role-unknown", [{"role": "wizard", "content": "x"}]), ("role-null", [{"role": None, "content": "x"}]),
    ("role-empty", [{"role": "", "content": "x"}]), ("content-number", [{"role": "user", "content": 5}]),
    ("content-object", [{"role": "user", "content": {"a": 1}}]),
    ("content-part-image", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    ("content-part-image-data-uri", [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:text/html;base64,aGVsbG8="}}]}]),
    ("content-part-audio", [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}]),
    ("content-part-video", [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}]),
    ("content-part-unknown", [{"role": "user", "content": [{"type": "hologram"}]}]),
    ("content-part-text-number", [{"role": "user", "content": [{"type": "text", "text": 5}]}]),
    ("content-part-string", [{"role": "user", "content": ["hi"]}]),
    ("message-string", ["hi"]), ("message-null", [None]), ("messages-string", "hello"), ("messages-object", {}),
    ("messages-empty", []), ("messages-null", None), ("messages-number", 5),
]


# A lone UTF-16 surrogate (valid JSON, no character) in a string each route hands to a tokenizer, a
# template or a matcher: refused as the JSON parse error it is, on every route.
LONE_SURROGATES = {
    "/completion": [rb'{"prompt": "\ud800", "n_predict": 1}', rb'{"prompt": ["hi", "x\udfff"], "n_predict": 1}',
                    rb'{"prompt": "hi", "n_predict": 1, "stop": ["\udbff"]}',
                    rb'{"prompt": "hi", "n_predict": 1, "logit_bias": [["\ud800", 1]]}',
                    rb'{"prompt": {"prompt_string": "\ud834"}, "n_predict": 1}'],
    "/v1/completions": [rb'{"prompt": "\ud800", "max_tokens": 1}'],
    "/v1/chat/completions": [rb'{"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 1}',
                             rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}',
                             rb'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, '
                             rb'"chat_template_kwargs": {"x": "\ud800"}}'],
    "/tokenize": [rb'{"content": "\ud800"}'],
    "/apply-template": [rb'{"messages": [{"role": "user", "content": "a\ud800"}]}'],
    "/v1/chat/completions/input_tokens": [rb'{"messages": [{"role": "user", "content": "\udfff"}]}'],
    "/detokenize": [rb'{"tokens": [1], "\ud800": 2}'],
}


def corpus() -> list[Case]:
    cases: list[Case] = []
    for route, bodies in LONE_SURROGATES.items():
        for i, raw in enumerate(bodies):
            cases.append(Case(f"lone-surrogate-{i}{route}", route, raw))
    for route in JSON_ROUTES:
        for name, raw in MALFORMED.items():
            cases.append(Case(f"malformed-{name}{route}", route, raw))
    for route in ("/completion", "/v1/chat/completions"):
        for field, value in {**WRONG_TYPES, **(CHAT_WRONG_TYPES if route in CHAT_ROUTES else {})}.items():
            cases.append(Case(f"type-{field}{route}", route, {**base(route), field: value}))
    for route, entries in OUT_OF_RANGE.items():
        for field, value in entries:
            cases.append(Case(f"range-{field}={str(value)[:12]}{route}", route, {**base(route), field: value}))
    for route in ("/completion", "/v1/completions"):
        for name, prompt in PROMPTS:
            cases.append(Case(f"prompt-{name}{route}", route, {"prompt": prompt, "n_predict": 1}))
        cases.append(Case(f"prompt-missing{route}", route, {"n_predict": 1}))
    long_text = "hello world " * 200
    cases += [
        Case("prompt-beyond-context/completion", "/completion", {"prompt": long_text, "n_predict": 1}, 400,
             "exceed_context_size_error"),
        Case("prompt-beyond-context/v1/chat", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": long_text}]}, 400, "exceed_context_size_error"),
        Case("prompt-far-beyond-context", "/completion", {"prompt": "word " * 38_000}, 400,
             "exceed_context_size_error"),  # refused from its length alone, before tokenizing
        Case("prompt-tokens-beyond-context", "/completion", {"prompt": [1] * (N_CTX + 5)}, 400,
             "exceed_context_size_error"),
        Case("prompt-over-max-prompt-tokens", "/completion", {"prompt": [1] * (MAX_PROMPT + 1)}),
        Case("chat-over-max-prompt-tokens", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "a b c d " * 25}]}),  # ~108 tokens
        Case("chat-top_logprobs-over-20", "/v1/chat/completions", {**base("/v1/chat/completions"), "logprobs": True,
                                                                 "top_logprobs": 21}),
        Case("chat-top_logprobs-negative", "/v1/chat/completions", {**base("/v1/chat/completions"),
                                                                   "logprobs": True, "top_logprobs": -1}),
    ]
    for route in ("/completion", "/v1/chat/completions"):
        for name, bias in LOGIT_BIAS:
            cases.append(Case(f"logit_bias-{name}{route}", route, {**base(route), "logit_bias": bias}))
        cases += [
            Case(f"stop-huge-list{route}", route, {**base(route), "stop": [f"s{i}" for i in range(1000)]}),
            Case(f"stop-list-number{route}", route, {**base(route), "stop": ["a", 5]}),
            Case(f"stop-too-long{route}", route, {**base(route), "stop": ["x" * 20_000]}),
            Case(f"stop-too-long-in-all{route}", route, {**base(route), "stop": ["y" * 100] * 200}),
            Case(f"stop-object{route}", route, {**base(route), "stop": {"a": 1}}),
        ]
    for route in (*CHAT_ROUTES, "/apply-template", "/v1/chat/completions/input_tokens"):
        for name, messages in MESSAGES:
            cases.append(Case(f"messages-{name}{route}", route, {"messages": messages}))
        cases.append(Case(f"messages-missing{route}", route, {"max_tokens": 1}))
    cases += [
        Case("tokenize-content-number", "/tokenize", {"content": 5}),
        Case("tokenize-content-list", "/tokenize", {"content": ["a"]}),
        Case("tokenize-with-pieces-string", "/tokenize", {"content": "a", "with_pieces": "yes"}),
        Case("tokenize-add-special-number", "/tokenize", {"content": "a", "add_special": 1}),
        Case("detokenize-string", "/detokenize", {"tokens": "abc"}),
        Case("detokenize-floats", "/detokenize", {"tokens": [1.5]}),
        Case("detokenize-negative", "/detokenize", {"tokens": [-1]}),
        Case("detokenize-beyond-vocab", "/detokenize", {"tokens": [VOCAB]}),
        Case("detokenize-huge", "/detokenize", {"tokens": [2**62]}),
        Case("detokenize-strings", "/detokenize", {"tokens": ["a"]}),
        Case("detokenize-object", "/detokenize", {"tokens": {"a": 1}}),
        Case("lora-adapters-post", "/lora-adapters", {"id": 0}),
        Case("unknown-route", "/does-not-exist", None, 404, "not_found_error", method="GET"),
        Case("get-on-post-route", "/completion", None, 404, "not_found_error", method="GET"),
        Case("delete-on-route", "/v1/chat/completions", None, 404, "not_found_error", method="DELETE"),
    ]
    big = {"prompt": "x" * (MAX_BODY + 10), "n_predict": 1}
    for route in JSON_ROUTES:
        cases.append(Case(f"oversized-body{route}", route, big, 413))
    return cases


CASES = corpus()


SEEN = {"cases": 0, "requests": 0, "4xx": 0, "5xx": 0}


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", str(SLOTS), "-c", str(N_CTX * SLOTS), "-n", "8",
                         "--max-body-size", str(MAX_BODY), "--max-prompt-tokens", str(MAX_PROMPT))
    yield proc
    print(f"\nbad input: {SEEN}")
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def check_error(r: httpx.Response, status: int, type_: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"code", "message", "type"}, err
    assert err["code"] == status and err["type"] == type_ and isinstance(err["message"], str) and err["message"]
    extra = set(err) - {"code", "message", "type"}
    assert extra <= {"n_prompt_tokens", "n_ctx"}, err


def normal_request(client: httpx.Client, i: int) -> None:
    if i % 2:
        r = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    else:
        r = client.post("/completion", json={"prompt": "hello", "n_predict": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["tokens_predicted"] == 2


def test_the_corpus_is_large_and_covers_every_route():
    assert len(CASES) >= 200
    assert {c.path for c in CASES} >= set(JSON_ROUTES)
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_a_4xx_and_the_server_keeps_serving(client, case):
    r = client.request(case.method, case.path, content=case.content(), headers=case.headers)
    SEEN["cases"] += 1
    SEEN["requests"] += 2  # the case and the normal request after it
    SEEN["4xx"] += 400 <= r.status_code < 500
    SEEN["5xx"] += r.status_code >= 500
    assert r.status_code < 500, (r.status_code, r.text[:300])
    check_error(r, case.status, case.type)
    normal_request(client, len(case.id))


def test_media_is_refused_with_upstreams_messages(client):
    """As a llama-server without a projector answers (400 here, 500 there), before any download."""
    def message(path, body):
        r = client.post(path, json=body)
        assert r.status_code == 400, r.text
        return r.json()["error"]["message"]

    chat = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "https://ggml.ai"}}]}]}
    assert message("/v1/chat/completions", chat).startswith("image input is not supported")
    chat["messages"][0]["content"][1] = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    assert message("/v1/chat/completions/input_tokens", chat).startswith("audio input is not supported")
    chat["messages"][0]["content"][1] = {"type": "hologram"}
    assert message("/apply-template", chat) == "unsupported content[].type"
    for data in ([], ["AAAA"]):
        prompt = {"prompt": {"prompt_string": "hi", "multimodal_data": data}, "n_predict": 1}
        assert message("/completion", prompt).startswith("Multimodal data provided, but model does not support")


def test_chunked_body_over_the_limit_is_413(client):
    def chunks():
        for _ in range(30):
            yield b" " * 10_000  # JSON whitespace: only the size is wrong
        yield b"{}"

    r = client.post("/completion", content=chunks())
    check_error(r, 413, "invalid_request_error")
    normal_request(client, 0)


def test_the_server_n_predict_is_a_default_a_request_overrides(client):
    """As upstream: ``-n`` is what a request gets when it names no length (or -1); its own wins."""
    r = client.post("/completion", json={"prompt": "hi", "ignore_eos": True})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
    r = client.post("/completion", json={"prompt": "hi", "n_predict": -1, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 12, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 12
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 3


def test_edge_inputs_that_are_valid_succeed(client):
    """Not every odd input is an error: these are answered normally, as upstream answers them."""
    for body in ({"prompt": "hi", "n_predict": 0}, {"prompt": ["hi", 5], "n_predict": 1},
                 {"prompt": "hi", "temperature": -1, "n_predict": 1}, {"prompt": "hi", "top_p": 7, "n_predict": 1},
                 {"prompt": "hi", "id_slot": 99, "n_predict": 1}, {"prompt": "hi", "logit_bias": [["hi", False]]},
                 {"prompt": "hi", "logit_bias": {"²": 1.0}, "n_predict": 1},
                 {"prompt": "h\u00e9llo \U0001f600 \u0000", "n_predict": 1},
                 {"prompt": "hi", "n_probs": 1024, "n_predict": 1},
                 {"prompt": "hi", "stop": [f"s{i}" for i in range(256)], "n_predict": 1}):
        r = client.post("/completion", json=body)
        assert r.status_code == 200, (body, r.text[:300])
    r = client.post("/tokenize", json={})
    assert r.status_code == 200 and r.json() == {"tokens": []}


def test_the_untokenized_length_bound_never_overestimates(tiny_llama):
    """``least_tokens`` may refuse a prompt without tokenizing it: it must be a true lower bound."""
    import random

    from mlxcel.server.http.prompts import least_tokens, longest_piece, tokenize_prompt

    piece = longest_piece(tiny_llama.tokenizer)
    assert piece > 0
    rng = random.Random(0)
    alphabet = "abc xyz\n\t.,;'\"é漢字😀\u0301ﬁ" + "".join(chr(rng.randrange(32, 0x3000)) for _ in range(200))
    texts = ["", "a" * 5000, " " * 5000, "word " * 2000, "<|im_start|>" * 300, "ﬁ" * 3000, "e\u0301" * 2000]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 6000))) for _ in range(40)]
    for text in texts:
        for prompt in (text, {"prompt_string": text}, [text, 5, text]):
            assert least_tokens(prompt, piece) <= len(tokenize_prompt(tiny_llama, prompt)), text[:40]
    assert least_tokens("word " * 38_000, piece) >= N_CTX
