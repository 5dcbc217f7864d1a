"""Which grammar a request runs under, read as llama-server reads ``grammar``, ``json_schema`` and
``response_format`` (no model needed: the grammars are compiled, not run)."""

from __future__ import annotations

import json

import pytest

from mlxcel.engine.sampling.grammar import GBNF, JSON_SCHEMA, LARK, compile_grammar
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.http.grammar_fields import constrain, request_grammar
from mlxcel.server.http.schema import ChatRequest, CompletionRequest
from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.runtime.task import GenerationOptions

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
GRAMMAR = 'root ::= "x"'


def native(**fields):
    return request_grammar(CompletionRequest.model_validate(fields))


def chat(**fields):
    return request_grammar(ChatRequest.model_validate(fields), chat=True)


def schema_of(grammar) -> dict:
    assert grammar.kind == JSON_SCHEMA
    return json.loads(grammar.source)


def test_the_native_parameters():
    assert native() is None and native(grammar="") is None
    assert native(grammar=GRAMMAR).kind == GBNF
    assert schema_of(native(json_schema=SCHEMA)) == SCHEMA
    assert schema_of(native(json_schema={})) == {"type": "object"}  # empty: any object
    assert native(json_schema=SCHEMA, grammar=GRAMMAR).kind == GBNF  # the grammar field wins there
    assert native(json_schema=SCHEMA, grammar="") is None
    fmt = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    assert schema_of(native(response_format=fmt, grammar=GRAMMAR)) == SCHEMA  # mlxcel reads it here too


def test_the_chat_parameters():
    assert schema_of(chat(response_format={"type": "json_object"})) == {"type": "object"}
    assert schema_of(chat(response_format={"type": "json_object", "schema": SCHEMA})) == SCHEMA
    assert schema_of(chat(response_format={"type": "json_object"}, json_schema=SCHEMA)) == SCHEMA  # kept
    assert schema_of(chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}})) == {
        "type": "object"}
    strict = chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": True}})
    assert strict.strict and not chat(json_schema=SCHEMA).strict
    assert chat(response_format={"type": "text"}) is None
    assert schema_of(chat(response_format={"type": "json_object"}, grammar=GRAMMAR)) == {"type": "object"}
    with pytest.raises(ApiError, match="Cannot use both json_schema and grammar"):
        chat(json_schema=SCHEMA, grammar=GRAMMAR)
    with pytest.raises(ApiError, match="but got: sound"):
        chat(response_format={"type": "sound"})
    tools = ChatRequest.model_validate({"grammar": GRAMMAR, "tools": [{"type": "function"}]})
    with pytest.raises(ApiError, match="custom grammar constraints with tools"):
        request_grammar(tools, chat=True, tools_called=True)


def test_the_servers_grammar_is_the_default_and_a_request_replaces_it():
    default = compile_grammar(JSON_SCHEMA, SCHEMA)
    req = CompletionRequest.model_validate({})
    assert request_grammar(req, default=default) is default
    assert request_grammar(CompletionRequest.model_validate({"grammar": GRAMMAR}), default=default).kind == GBNF


def test_constrain_is_one_call_for_a_grammar_built_elsewhere():
    opts = GenerationOptions(sampler=SamplerParams())
    constrain(opts, LARK, 'start: "call" %json {"type": "object"}')
    assert opts.grammar.kind == LARK
    constrain(opts, JSON_SCHEMA, SCHEMA)
    assert schema_of(opts.grammar) == SCHEMA
    with pytest.raises(ApiError, match="failed to parse grammar"):
        constrain(opts, GBNF, "root ::= (")
