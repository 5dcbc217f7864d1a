"""Grammars for constrained decoding: what a request may constrain its output with, compiled by
llguidance.

Four sources, one compiled form (llguidance's grammar, which its matcher runs):

* ``gbnf``: llama.cpp's GBNF (``root ::= ...``), converted to llguidance's Lark dialect by
  llguidance's own converter. As upstream does, a text that is already Lark (``%llguidance`` or a
  ``start:`` rule) is taken as Lark;
* ``lark``: llguidance's Lark dialect, which can embed JSON schemas (``%json {...}``), regexes and
  special tokens (what a tool-call grammar is written in);
* ``json_schema``: a JSON Schema. Whitespace between JSON tokens follows llama-server's own
  converter (one space, or one or two newlines and up to 20 spaces or tabs), so a small model cannot
  spend its whole budget on indentation; a schema's own ``x-guidance`` options (llguidance's
  extension: ``whitespace_flexible``, ``whitespace_pattern``, ``item_separator``...) win. ``strict`` refuses keywords the engine cannot enforce (as
  OpenAI's strict structured outputs do); otherwise they are ignored and the rest of the schema holds;
* ``regex``: a regular expression the whole output must match.

:func:`compile_grammar` is the one entry point; it validates the grammar (no tokenizer needed) and
raises :class:`GrammarError` with the engine's reason. ``grammar_matcher`` runs a compiled grammar
over one sequence's tokens.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark

from mlxcel.engine.errors import MlxcelError

log = logging.getLogger(__name__)

GBNF = "gbnf"
LARK = "lark"
JSON_SCHEMA = "json_schema"
REGEX = "regex"
KINDS = (GBNF, LARK, JSON_SCHEMA, REGEX)

# llama-server's JSON whitespace (its converter's `space` rule): nothing, one space, or one or two
# newlines followed by at most 20 spaces or tabs.
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"


class GrammarError(MlxcelError):
    """A grammar or schema that cannot be compiled, or a matcher that can go no further."""


@dataclass(frozen=True)
class Grammar:
    """A validated grammar. ``source`` is what was given (a schema as compact JSON), for echoing;
    ``compiled`` is llguidance's grammar, what a matcher runs."""

    kind: str
    source: str
    compiled: str
    strict: bool = False


def compile_grammar(kind: str, source: Any, *, strict: bool = False) -> Grammar:
    """Compile and validate ``source`` as a grammar of ``kind`` (``gbnf``, ``lark``,
    ``json_schema``: a schema object or its JSON text, ``regex``). ``strict`` only concerns JSON
    schemas: keywords the engine cannot enforce are then an error instead of being ignored."""
    if kind == JSON_SCHEMA:
        try:
            schema = json.loads(source) if isinstance(source, str) else source
        except ValueError as exc:
            raise GrammarError(f"the schema is not JSON: {exc}") from None
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        compiled = _schema_grammar(schema, strict)
    elif kind in (GBNF, LARK):
        if not isinstance(source, str):
            raise GrammarError(f"a {kind} grammar must be a string")
        text = source
        try:
            lark = any_to_lark(source) if kind == GBNF else source
        except Exception as exc:  # the converter raises plain exceptions with a position
            raise GrammarError(str(exc)) from None
        compiled = LLMatcher.grammar_from_lark(lark)
    elif kind == REGEX:
        text = str(source)
        compiled = LLMatcher.grammar_from_regex(text)
    else:
        raise ValueError(f"unknown grammar kind {kind!r}; one of {', '.join(KINDS)}")
    failed, messages = LLMatcher.validate_grammar_with_warnings(compiled)
    if failed:
        raise GrammarError("; ".join(messages) or "invalid grammar")
    for message in messages:
        log.info("grammar (%s): %s", kind, message)
    return Grammar(kind, text, compiled, strict)


def _schema_grammar(schema: Any, strict: bool) -> str:
    if schema is True:  # any JSON value
        schema = {}
    if schema is False:
        raise GrammarError("the schema false admits no value")
    if not isinstance(schema, dict):
        raise GrammarError("schema must be an object or boolean")
    options: dict[str, Any] = {"lenient": not strict}
    own = schema.get("x-guidance")
    if not (isinstance(own, dict) and ("whitespace_pattern" in own or "whitespace_flexible" in own)):
        options["whitespace_pattern"] = JSON_WHITESPACE  # a schema's own x-guidance whitespace wins
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=options)
    except ValueError as exc:
        raise GrammarError(str(exc)) from None
