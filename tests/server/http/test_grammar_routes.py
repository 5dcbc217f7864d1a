"""Constrained decoding on a real server (tiny llama checkpoint, prompt lookup on), driven by httpx and
the official ``openai`` client.

* ``client.chat.completions.parse()`` with a pydantic model returns the parsed model; ``json_object``
  returns a JSON object; a streamed constrained chat reassembles to the non-streamed one;
* ``grammar`` / ``json_schema`` on ``/completion``, ``response_format`` on ``/v1/completions``;
* constrained speculation (prompt lookup) answers exactly what the same request decoded plainly
  (``speculative.n_max: 0``) answers, and says it drafted;
* constrained requests decoded together in the batched step each follow their own grammar;
* invalid grammars and schemas get upstream's 400 bodies;
* ``--json-schema`` constrains every request that names no grammar of its own, and a bad one ends the
  command line.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field
from server_process import ServerProcess, run_server_command

CHAT = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog"}]
WORDS = ("the", "quick", "brown", "fox", "dog", "lazy")
SENTENCE = 'root ::= word (" " word){4,9} "."\nword ::= "' + '" | "'.join(WORDS) + '"'
SENTENCE_RE = re.compile(rf"({'|'.join(WORDS)})( ({'|'.join(WORDS)})){{4,9}}\.")
SMALL = {"type": "object", "properties": {"k": {"enum": ["cat", "dog"]}, "n": {"type": "integer", "minimum": 0,
                                                                          "maximum": 9}},
         "required": ["k", "n"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}


class Pet(BaseModel):
    name: str = Field(max_length=5)
    kind: Literal["cat", "dog", "fox"]
    age: int = Field(ge=0, le=20)


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", "4096", "-np", "4", "--spec-type", "ngram-simple")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def test_openai_parse_returns_the_pydantic_model(client):
    for seed in (1, 2):
        completion = client.chat.completions.parse(model="tiny", messages=CHAT, response_format=Pet, max_tokens=400,
                                                   seed=seed, temperature=1.0)
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Pet)
        assert Pet.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_object_answers_a_json_object(client):
    body = dict(model="tiny", messages=CHAT, max_tokens=300, temperature=1.0)
    finished = 0
    for seed in range(6):
        choice = client.chat.completions.create(response_format={"type": "json_object"}, seed=seed, **body).choices[0]
        text = choice.message.content
        assert text.startswith("{"), text
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
            finished += 1
    assert finished > 0
    # upstream's json_object with a schema
    choice = client.chat.completions.create(response_format={"type": "json_object", "schema": SMALL}, seed=1,
                                            **body).choices[0]
    assert choice.finish_reason == "stop" and json.loads(choice.message.content)["k"] in ("cat", "dog")


def test_a_streamed_constrained_chat_reassembles_to_the_plain_answer(client):
    body = dict(model="tiny", messages=CHAT, max_tokens=80, temperature=0.0,
                response_format={"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL}})
    whole = client.chat.completions.create(**body).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **body)
             if c.choices]
    assert "".join(parts) == whole and json.loads(whole)["n"] in range(10)


def test_grammar_and_schemas_on_the_completion_routes(server):
    native = post(server, "/completion", {"prompt": "the quick", "n_predict": 60, "grammar": SENTENCE, "seed": 4})
    body = native.json()
    assert native.status_code == 200 and SENTENCE_RE.fullmatch(body["content"]), body["content"]
    assert body["stop_type"] == "eos" and body["generation_settings"]["grammar"] == SENTENCE
    schema = post(server, "/completion", {"prompt": "the quick", "n_predict": 60, "json_schema": SMALL, "seed": 4})
    assert json.loads(schema.json()["content"])["k"] in ("cat", "dog")
    oai = post(server, "/v1/completions", {"prompt": "the quick", "max_tokens": 60, "seed": 4,
                                           "response_format": {"type": "json_schema", "json_schema": {"schema": SMALL}}})
    assert oai.json()["choices"][0]["finish_reason"] == "stop" and json.loads(oai.json()["choices"][0]["text"])


def test_constrained_speculation_answers_what_plain_decoding_answers(server):
    prompt = "the quick brown fox the lazy dog the quick brown fox the lazy dog the quick"
    for temperature in (0.0, 0.9):
        body = {"prompt": prompt, "n_predict": 60, "grammar": SENTENCE, "temperature": temperature, "seed": 7}
        drafted = post(server, "/completion", body).json()
        plain = post(server, "/completion", {**body, "speculative.n_max": 0}).json()
        assert drafted["content"] == plain["content"] and SENTENCE_RE.fullmatch(plain["content"])
        assert drafted["timings"]["draft_n"] > 0 and "draft_n" not in plain["timings"]


def test_constrained_rows_decoded_together_each_follow_their_own_grammar(server):
    bodies = [{"prompt": f"request {i}", "n_predict": 60, "seed": i, "speculative.n_max": 0,
               **({"grammar": SENTENCE} if i % 2 else {"json_schema": SMALL})} for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: post(server, "/completion", b).json(), bodies))
    for i, answer in enumerate(answers):
        if i % 2:
            assert SENTENCE_RE.fullmatch(answer["content"]), answer["content"]
        else:
            assert json.loads(answer["content"])["k"] in ("cat", "dog")


def ref_chain(links: int) -> dict:
    """A schema whose ``$ref`` chain is ``links`` long: an object whose optional ``next`` is the next
    link (the reported shape, ~70 bytes a link), the last a string."""
    defs = {f"n{i}": {"type": "object", "properties": {"next": {"$ref": f"#/$defs/n{i + 1}"}}} for i in range(links)}
    return {"$ref": "#/$defs/n0", "$defs": {**defs, f"n{links}": {"type": "string"}}}


def follows_the_chain(value) -> bool:
    while isinstance(value, dict):
        if set(value) - {"next"}:
            return False
        value = value.get("next", "")
    return isinstance(value, str)


@pytest.mark.parametrize("route", ["chat response_format", "completion json_schema", "responses text.format",
                                   "anthropic output_format"])
def test_a_1000_link_ref_chain_compiles_and_the_server_keeps_serving(server, route):
    """The schema used to overflow llguidance's stack (SIGSEGV: the server died). It compiles on the
    grammar's big stack, as llama-server compiles it: a 200 whose output follows it."""
    schema = ref_chain(1000)
    assert len(json.dumps(schema)) > 60_000
    path, body = {
        "chat response_format": ("/v1/chat/completions", {"messages": CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "chain", "schema": schema}}}),
        "completion json_schema": ("/completion", {"prompt": "the quick", "json_schema": schema}),
        "responses text.format": ("/v1/responses", {"input": "the quick", "text": {"format": {
            "type": "json_schema", "name": "chain", "schema": schema}}}),
        "anthropic output_format": ("/v1/messages", {"messages": CHAT, "output_format": {"type": "json_schema",
                                                                                        "schema": schema}}),
    }[route]
    r = post(server, path, {**body, "max_tokens": 40, "n_predict": 40, "seed": 1})
    assert r.status_code == 200, r.text
    text = json.dumps(r.json())
    assert '{' in text
    if path == "/completion":
        assert r.json()["content"].startswith("{")
        if r.json()["stop_type"] == "eos":
            assert follows_the_chain(json.loads(r.json()["content"]))
    after = post(server, "/completion", {"prompt": "the quick", "n_predict": 20, "grammar": SENTENCE, "seed": 4})
    assert after.status_code == 200 and SENTENCE_RE.fullmatch(after.json()["content"])


def rule_chain(kind: str, rules: int) -> str:
    if kind == "gbnf":
        return "root ::= a0\n" + "".join(f"a{i} ::= a{i + 1}\n" for i in range(rules)) + f'a{rules} ::= "x"\n'
    return "start: a0\n" + "".join(f"a{i}: a{i + 1}\n" for i in range(rules)) + f'a{rules}: "x"\n'


OVER_LIMITS = [  # (what, body, what the 400 says): past a limit, refused at once, the server serving on
    ("a 4,000-rule GBNF chain", {"grammar": rule_chain("gbnf", 4000)}, "chain of 4002 rules"),
    ("a 5,000-rule Lark chain", {"grammar": rule_chain("lark", 5000)}, "chain of 5002 rules"),
    ("a 1 MB GBNF alternation", {"grammar": "root ::= " + " | ".join(f'"a{i}"' for i in range(100_000))},
     "at most 131072 are accepted"),
    ("a 5,000-link $ref chain", {"json_schema": ref_chain(5000)}, "$ref chain is 5001 links long"),
]


@pytest.mark.parametrize("what,body,message", OVER_LIMITS, ids=[c[0] for c in OVER_LIMITS])
def test_a_grammar_past_the_limits_is_a_clear_400(server, what, body, message):
    r = post(server, "/completion", {"prompt": "hi", "n_predict": 4, **body})
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"], error["message"][:300]
    assert post(server, "/completion", {"prompt": "hi", "n_predict": 4}).status_code == 200


BAD = [
    ("/completion", {"prompt": "hi", "grammar": "root ::= this is (not valid"},
     "Failed to initialize samplers: failed to parse grammar: "),
    ("/completion", {"prompt": "hi", "json_schema": {"type": "hiccup"}},
     "Field 'json_schema': \"json_schema\": JSON schema conversion failed:\nInvalid type: hiccup"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object", "schema": {"type": "hiccup"}}},
     "Unable to generate parser for this template. Automatic parser generation failed: Invalid type: hiccup"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object", "schema": 123}},
     "Unable to generate parser for this template. Automatic parser generation failed: schema must be an object"),
    ("/v1/chat/completions", {"messages": CHAT, "grammar": "root ::= this is (not valid GBNF"},
     "Failed to initialize samplers: failed to parse grammar"),
    ("/v1/chat/completions", {"messages": CHAT, "json_schema": {"type": "object"}, "grammar": 'root ::= "a"'},
     "Cannot use both json_schema and grammar"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "sound"}},
     'response_format type must be one of "text" or "json_object", but got: sound'),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "strict": True, "schema": {"type": "array", "uniqueItems": True}}}}, "uniqueItems"),
    ("/v1/chat/completions", {"messages": CHAT, "grammar": 'root ::= "a"',
                              "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "Cannot use custom grammar constraints with tools."),
]


@pytest.mark.parametrize("path,body,message", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_invalid_grammars_and_schemas_get_upstreams_400(server, path, body, message):
    r = post(server, path, {**body, "max_tokens": 4})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert error["message"].startswith(message) or message in error["message"], error["message"]


def test_the_command_lines_schema_constrains_every_request(tiny_llama_dir, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SMALL))
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", "1024", "-np", "2", "-jf", str(path))
    try:
        default = post(proc, "/completion", {"prompt": "hi", "n_predict": 40, "seed": 3}).json()
        assert json.loads(default["content"])["k"] in ("cat", "dog")
        assert default["generation_settings"]["grammar"] == json.dumps(SMALL, separators=(",", ":"))
        own = post(proc, "/completion", {"prompt": "hi", "n_predict": 40, "seed": 3, "grammar": 'root ::= "ok"'})
        assert own.json()["content"] == "ok"
        chat = post(proc, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 40, "seed": 3}).json()
        assert json.loads(chat["choices"][0]["message"]["content"])["n"] in range(10)
    finally:
        proc.stop()
    bad = run_server_command("-m", str(tiny_llama_dir), "-j", '{"type": "hiccup"}')
    assert bad.returncode == 2 and "-j/--json-schema: Invalid type: hiccup" in bad.stderr
    both = run_server_command("-m", str(tiny_llama_dir), "-j", "{}", "--grammar", 'root ::= "a"')
    assert both.returncode == 2 and "give one of them" in both.stderr
