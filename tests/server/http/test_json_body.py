"""The one decoder of JSON request bodies (``http.json_body``), as a unit: what it refuses beyond
JSON's syntax (text no tokenizer takes, nesting past the limit, numbers no double holds) and what
it must still accept. Every route's use of it is swept on a real server in ``test_bad_input``."""

from __future__ import annotations

import json

import pytest

from mlxcel.server.http.json_body import decode_json, parse_body
from mlxcel.server.http.limits import MAX_JSON_DEPTH
from mlxcel.server.runtime.errors import ApiError


def refused(raw: bytes) -> str:
    with pytest.raises(ApiError) as err:
        decode_json(raw)
    assert err.value.status == 400 and err.value.type == "invalid_request_error"
    return err.value.message


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("raw", [
    b'{"a": "x\xed\xa0\x80"}',  # a high surrogate encoded as UTF-8 (CESU-8 / WTF-8)
    b'{"a": "\xed\xbf\xbf"}',  # a low one
    b'{"\xed\xa0\x80": 1}',  # in a key
    b'{"a": "\xed\xa0\xbd\xed\xb8\x80"}',  # a pair, each half encoded on its own: still not UTF-8
])
def test_a_surrogate_encoded_as_utf8_is_refused_where_it_is(raw):
    message = refused(raw)
    assert "parse error at line 1, column" in message and "surrogate" in message, message


def test_the_position_of_an_ill_formed_byte_is_its_line_and_column():
    assert refused(b'{\n  "a": 1,\n  "b": "caf\xe9"\n}').startswith("parse error at line 3, column 12: ")


@pytest.mark.parametrize("raw", [b'{"a": "\x80"}', b'{"a": "\xc0\xaf"}', b'{"a": "\xe2\x82"}', b'{"a": "\xf4\x90\x80\x80"}',
                                 b'{"a": 1}\xff', '{"a": 1}'.encode("utf-16")])
def test_ill_formed_utf8_is_refused(raw):
    assert "ill-formed UTF-8" in refused(raw)


@pytest.mark.parametrize("raw", [rb'{"a": "\ud800"}', rb'{"a": "\udc00\ud800"}', rb'{"\udfff": 1}',
                                 rb'{"a": [{"b": "x\uDBFF"}]}'])
def test_an_escaped_lone_surrogate_is_refused(raw):
    assert "lone UTF-16 surrogate" in refused(raw)


def test_text_that_is_well_formed_is_kept():
    assert decode_json(rb'{"a": "\ud83d\ude00"}') == {"a": "\U0001f600"}  # an escaped pair
    text = {"a": "é漢😀\u0000"}
    assert decode_json(json.dumps(text, ensure_ascii=False).encode()) == text
    assert decode_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a byte order mark, as upstream's parser skips it


def test_nesting_is_bounded_without_recursing():
    assert decode_json(nested(MAX_JSON_DEPTH)) == json.loads(nested(MAX_JSON_DEPTH))
    for depth in (MAX_JSON_DEPTH + 1, 900, 5000, 200_000):
        assert "nests deeper" in refused(nested(depth))
    assert "nests deeper" in refused(b"[" * 200_000)  # unclosed: the decoder's own recursion is the bound
    assert decode_json(b'"' + b"[" * 100 + b'"') == "[" * 100  # brackets in a string are no nesting


@pytest.mark.parametrize("raw", [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b'{"a": 1e400}',
                                 b'{"a": ' + b"9" * 5000 + b"}"])
def test_numbers_no_double_holds_are_refused(raw):
    assert refused(raw).startswith("parse error")


def test_a_route_body_is_an_object():
    assert decode_json(b"[1]") == [1]
    with pytest.raises(ApiError, match="must be a JSON object, but is array"):
        parse_body(b"[1]")
    assert "empty input" in refused(b"  \n")
