"""No silent drops: every request field upstream reads (the compat record lists them all, and
``test_flags_and_record`` holds the record to upstream's sources) is posted to a real server with a
value other than its default, and each is either honoured (the answer shows it) or refused with a
400 that names it."""

from __future__ import annotations

import json

import httpx
import pytest
from server_process import REPO, ServerProcess

from mlxcel.server.cli import compat_record

SAMPLED = {"prompt": "one two three one two three one two", "n_predict": 10, "seed": 5, "temperature": 1.0,
           "top_k": 0, "top_p": 1.0, "min_p": 0.0, "ignore_eos": True}
CHAT = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 6, "seed": 5}


def record_fields() -> dict[str, str]:
    data = json.loads((compat_record.record_dir(REPO) / "request_fields.json").read_text())
    return {f["field"]: f["state"] for f in data["fields"]}


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "2", "-c", "1024", "--spec-type", "ngram-simple",
                         "--slots")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def baseline(client):
    r = client.post("/completion", json=SAMPLED)
    assert r.status_code == 200
    return r.json()


def post(client, path, body):
    return client.post(path, json=body)


def differs(field, value, path="/completion"):
    """The field changes the sampled completion of the same seed."""
    def check(client, baseline):
        r = post(client, path, {**SAMPLED, field: value})
        assert r.status_code == 200, r.text
        assert r.json()["content"] != baseline["content"] or r.json()["tokens_predicted"] != baseline[
            "tokens_predicted"], field
    return check


def echoed(field, value, key=None):
    """The field is in force: generation_settings shows it."""
    def check(client, baseline):
        r = post(client, "/completion", {**SAMPLED, field: value})
        assert r.status_code == 200, r.text
        got = r.json()["generation_settings"][key or field]
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, (field, got)
    return check


def refused(field, value, path="/completion", base=None):
    def check(client, baseline):
        r = post(client, path, {**(base or SAMPLED), field: value})
        assert r.status_code == 400, (field, r.text)
        assert field.split(".")[-1] in r.json()["error"]["message"] or field in r.json()["error"]["message"], r.text
    return check


def _no_tower_refuses(client) -> None:
    r = post(client, "/completion", {"prompt": {"prompt_string": "hi", "multimodal_data": ["AAAA"]}})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("Multimodal data provided"), r.text


def body_has(path, body, test):
    def check(client, baseline):
        r = post(client, path, body)
        assert r.status_code == 200, r.text
        assert test(r.json()), r.json()
    return check


def chat_prompt(extra, test):
    """The rendered chat prompt (/apply-template) satisfies ``test``."""
    return body_has("/apply-template", {"messages": CHAT["messages"], **extra}, lambda b: test(b["prompt"]))


def streamed(body, test, path="/completion"):
    def check(client, baseline):
        with client.stream("POST", path, json={**body, "stream": True}) as r:
            assert r.status_code == 200
            raw = b"".join(r.iter_bytes())
        assert test(raw), raw[:500]
    return check


def n_tokens(n, field, path="/completion"):
    base = {k: v for k, v in SAMPLED.items() if k != "n_predict"}  # n_predict would win over its aliases
    return body_has(path, {**base, field: n}, lambda b: b["tokens_predicted"] == n)


CASES = {
    "prompt": body_has("/completion", {**SAMPLED, "prompt": "two"}, lambda b: b["tokens_evaluated"] < 5),
    "n_predict": n_tokens(3, "n_predict"),
    "max_tokens": n_tokens(4, "max_tokens"),
    "max_completion_tokens": n_tokens(5, "max_completion_tokens"),
    "n_indent": body_has("/completion", {**SAMPLED, "n_indent": 4, "n_predict": 40},
                         lambda b: all(line.startswith(("    ", "\t")) or not line.strip()
                                       for line in b["content"].split("\n")[1:])),
    "t_max_predict_ms": body_has("/completion", {**SAMPLED, "t_max_predict_ms": 1}, lambda b: True),
    "n_cache_reuse": body_has("/completion", {**SAMPLED, "n_cache_reuse": 16}, lambda b: True),  # output-neutral
    "sse_ping_interval": streamed({**SAMPLED, "sse_ping_interval": 1}, lambda raw: b"data: " in raw),
    "backend_sampling": body_has("/completion", {**SAMPLED, "backend_sampling": True}, lambda b: True),  # neutral
    "echo": body_has("/v1/completions", {"prompt": "one two", "max_tokens": 2, "echo": True},
                     lambda b: b["choices"][0]["text"].startswith("one two")),
    # this server has no vision tower: upstream's refusal (test_vision_server.py honours the field)
    "multimodal_data": lambda client, baseline: _no_tower_refuses(client),
    "temperature": differs("temperature", 0.0),
    "top_k": differs("top_k", 1),
    "top_p": differs("top_p", 0.05),
    "min_p": differs("min_p", 0.9),
    "typical_p": echoed("typical_p", 0.5),
    "xtc_probability": echoed("xtc_probability", 0.5),
    "xtc_threshold": echoed("xtc_threshold", 0.2),
    "repeat_last_n": echoed("repeat_last_n", 8),
    "repeat_penalty": echoed("repeat_penalty", 1.5),
    "presence_penalty": echoed("presence_penalty", 0.5),
    "frequency_penalty": echoed("frequency_penalty", 0.5),
    "dry_multiplier": echoed("dry_multiplier", 0.5),
    "dry_base": echoed("dry_base", 2.0),
    "dry_allowed_length": echoed("dry_allowed_length", 3),
    "dry_penalty_last_n": echoed("dry_penalty_last_n", 16),
    "dry_sequence_breakers": echoed("dry_sequence_breakers", ["x"]),
    "logit_bias": body_has("/completion", {**SAMPLED, "logit_bias": [[5, 100.0]], "n_predict": 3, "return_tokens": True},
                           lambda b: b["tokens"] == [5, 5, 5]),
    "ignore_eos": echoed("ignore_eos", False),
    "seed": differs("seed", 6),
    "stop": body_has("/completion", {**SAMPLED, "stop": ["e"]}, lambda b: "e" not in b["content"]),
    "n_probs": body_has("/completion", {**SAMPLED, "n_probs": 2}, lambda b: len(b["completion_probabilities"]) > 0),
    "post_sampling_probs": body_has("/completion", {**SAMPLED, "n_probs": 2, "post_sampling_probs": True},
                                    lambda b: "prob" in b["completion_probabilities"][0]),
    "logprobs": body_has("/v1/completions", {"prompt": "hi", "max_tokens": 2, "logprobs": 2},
                         lambda b: b["choices"][0]["logprobs"] is not None),
    "top_logprobs": body_has("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2},
                             lambda b: len(b["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2),
    "cache_prompt": body_has("/completion", {**SAMPLED, "cache_prompt": False}, lambda b: b["timings"]["cache_n"] == 0),
    "id_slot": body_has("/completion", {**SAMPLED, "id_slot": 1}, lambda b: b["id_slot"] == 1),
    "return_tokens": body_has("/completion", {**SAMPLED, "return_tokens": True}, lambda b: len(b["tokens"]) == 10),
    "return_progress": streamed({**SAMPLED, "return_progress": True}, lambda raw: b"prompt_progress" in raw),
    "response_fields": body_has("/completion", {**SAMPLED, "response_fields": ["content"]}, lambda b: list(b) == [
        "content"]),
    "timings_per_token": streamed({**SAMPLED, "timings_per_token": True}, lambda raw: raw.count(b'"timings"') > 2),
    "stream": streamed(SAMPLED, lambda raw: raw.startswith(b"data: ")),
    "stream_options": streamed({**CHAT, "stream_options": {"include_usage": True}},
                               lambda raw: b'"usage"' in raw, path="/v1/chat/completions"),
    "include_usage": streamed({**CHAT, "stream_options": {"include_usage": True}},
                              lambda raw: b'"choices":[]' in raw, path="/v1/chat/completions"),
    "n_cmpl": body_has("/completion", {**SAMPLED, "n_cmpl": 2}, lambda b: isinstance(b, list) and len(b) == 2),
    "n": body_has("/v1/chat/completions", {**CHAT, "n": 2}, lambda b: len(b["choices"]) == 2),
    "samplers": echoed("samplers", ["top_k", "temperature"]),
    "messages": chat_prompt({}, lambda p: "one two three" in p),
    "chat_template_kwargs": chat_prompt({"chat_template_kwargs": {"add_generation_prompt": False}},
                                        lambda p: not p.rstrip().endswith("assistant")),
    "add_generation_prompt": body_has("/apply-template", {"messages": CHAT["messages"], "add_generation_prompt": False},
                                      lambda b: not b["prompt"].rstrip().endswith("assistant")),
    "continue_final_message": chat_prompt({"messages": [*CHAT["messages"], {"role": "assistant", "content": "four"}],
                                           "continue_final_message": True, "add_generation_prompt": False},
                                          lambda p: p.rstrip().endswith("four")),
    "tools": chat_prompt({"tools": [{"type": "function", "function": {"name": "get_weather_xyz", "parameters": {}}}]},
                         lambda p: True),  # rendered where the template renders tools (parsed: test_tool_calls_reasoning)
    "tool_choice": body_has("/v1/chat/completions", {**CHAT, "tool_choice": "none"}, lambda b: True),
    "parallel_tool_calls": body_has("/v1/chat/completions", {**CHAT, "parallel_tool_calls": False}, lambda b: True),
    "reasoning_format": refused("reasoning_format", "sometimes", path="/v1/chat/completions", base=CHAT),
    "reasoning_effort": body_has("/v1/chat/completions", {**CHAT, "reasoning_effort": "low"}, lambda b: True),
    "verbose": body_has("/v1/chat/completions", {**CHAT, "verbose": True}, lambda b: "__verbose" in b),
    "n_keep": echoed("n_keep", 4),
    "n_discard": echoed("n_discard", 4),
    "min_keep": echoed("min_keep", 2),
    "grammar": body_has("/completion", {**SAMPLED, "grammar": 'root ::= "a" "b"?'},
                        lambda b: b["content"] in ("a", "ab") and b["stop_type"] == "eos"),
    "json_schema": body_has("/completion", {**SAMPLED, "json_schema": {"enum": ["x", "yz"]}},
                            lambda b: b["content"] in ('"x"', '"yz"')),
    "response_format": body_has("/v1/chat/completions",
                                {**CHAT, "response_format": {"type": "json_schema",
                                                             "json_schema": {"schema": {"enum": [1, 22]}}}},
                                lambda b: b["choices"][0]["message"]["content"] in ("1", "22")),
    "mirostat": refused("mirostat", 2),
    "mirostat_tau": echoed("mirostat_tau", 3.0),
    "mirostat_eta": echoed("mirostat_eta", 0.2),
    "top_n_sigma": refused("top_n_sigma", 1.0),
    "dynatemp_range": refused("dynatemp_range", 0.5),
    "dynatemp_exponent": echoed("dynatemp_exponent", 2.0),
    "adaptive_target": refused("adaptive_target", 0.5),
    "adaptive_decay": echoed("adaptive_decay", 0.5),
    "lora": refused("lora", [{"id": 0, "scale": 1.0}]),
    "speculative.n_max": body_has("/completion", {**SAMPLED, "speculative.n_max": 0},
                                  lambda b: "draft_n" not in b["timings"]),
    "speculative.n_min": body_has("/completion", {**SAMPLED, "speculative.n_min": 2}, lambda b: True),
    "speculative.p_min": body_has("/completion", {**SAMPLED, "speculative.p_min": 0.5}, lambda b: True),  # neutral
    "speculative.type": refused("speculative.type", "draft-simple"),
    "speculative.ngram_size_n": body_has("/completion", {**SAMPLED, "speculative.ngram_size_n": 2}, lambda b: True),
    "speculative.ngram_size_m": body_has("/completion", {**SAMPLED, "speculative.ngram_size_m": 2},
                                         lambda b: b["timings"].get("draft_n", 0) <= 2 * b["timings"].get(
                                             "draft_rounds", 0)),
    "speculative.ngram_min_hits": refused("speculative.ngram_min_hits", 3),
    "timings.draft_n": body_has("/completion", SAMPLED, lambda b: "timings" in b),
    "prediction": body_has("/completion", {**SAMPLED, "prediction": {"type": "content", "content": "one two"}},
                           lambda b: b["accepted_prediction_tokens"] + b["rejected_prediction_tokens"] > 0),
    "mlxcel_draft_flags": streamed({**SAMPLED, "mlxcel_draft_flags": True},
                                   lambda raw: b'"mlxcel_draft_flags": [' in raw or b'"mlxcel_draft_flags":[' in raw),
    "model": body_has("/completion", {**SAMPLED, "model": "anything"}, lambda b: True),
    **{name: refused(name, "x") for name in (
        "chat_format", "chat_parser", "generation_prompt", "parse_tool_calls", "preserved_tokens", "grammar_lazy",
        "grammar_triggers", "reasoning_control")},
    # honoured (tests/server/http/test_tool_calls_reasoning.py forces the end tag); here: a bad value is refused
    **{name: refused(name, value) for name, value in (
        ("reasoning_budget_tokens", "x"), ("thinking_budget_tokens", "x"), ("reasoning_budget_start_tag", 5),
        ("reasoning_budget_end_tag", 5), ("reasoning_budget_end_tags", "x"), ("reasoning_budget_message", 5))},
}


def test_every_recorded_field_has_a_case():
    assert set(record_fields()) - set(CASES) == set(), "a recorded field without a check here"


@pytest.mark.parametrize("field", sorted(CASES))
def test_the_field_is_honoured_or_refused(client, baseline, field):
    states = record_fields()
    if states.get(field) == "refused":
        assert CASES[field].__qualname__.startswith("refused"), f"{field} is recorded refused: check the 400"
    CASES[field](client, baseline)
