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

A grammar comes from a request, so compiling it is bounded: ``grammar_limits`` refuses, before
llguidance sees it, a text over 128 KiB, a ``$ref`` or rule chain over 2,048 links, terminals chained
or inlined past their limits, nesting past 100 levels (see there for each limit and why);
``grammar_gbnf`` converts GBNF in linear time; and the compile runs on ``grammar_stack``'s thread,
whose large stack holds every chain the limits let through (llguidance recurses once per link, and a
stack overflow would be a SIGSEGV that ends the server), under a deadline.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from mlxcel.engine.sampling.grammar_error import GrammarError
from mlxcel.engine.sampling.grammar_gbnf import gbnf_to_lark
from mlxcel.engine.sampling.grammar_limits import check_schema, check_size, parser_limits
from mlxcel.engine.sampling.grammar_rules import check_lark
from mlxcel.engine.sampling.grammar_stack import on_big_stack

log = logging.getLogger(__name__)

GBNF = "gbnf"
LARK = "lark"
JSON_SCHEMA = "json_schema"
REGEX = "regex"
KINDS = (GBNF, LARK, JSON_SCHEMA, REGEX)

# llama-server's JSON whitespace (its converter's `space` rule): nothing, one space, or one or two
# newlines followed by at most 20 spaces or tabs.
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"


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
    schemas: keywords the engine cannot enforce are then an error instead of being ignored. Within
    ``grammar_limits`` (size, rule and ``$ref`` chains, nesting) or a :class:`GrammarError` that says
    which; compiled on ``grammar_stack``'s big stack, so no input can overflow the thread's stack."""
    if kind not in KINDS:
        raise ValueError(f"unknown grammar kind {kind!r}; one of {', '.join(KINDS)}")
    return on_big_stack(lambda: _compile(kind, source, strict))


def _compile(kind: str, source: Any, strict: bool) -> Grammar:
    if kind == JSON_SCHEMA:
        schema = _schema_value(source)
        check_schema(schema)
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        check_size(text, "the JSON schema")
        compiled = _schema_grammar(schema, strict)
    elif kind in (GBNF, LARK):
        if not isinstance(source, str):
            raise GrammarError(f"a {kind} grammar must be a string")
        text = source
        check_size(text, f"the {kind} grammar")
        lark = gbnf_to_lark(source) if kind == GBNF else source
        check_lark(lark)
        compiled = LLMatcher.grammar_from_lark(lark)
    else:
        text = str(source)
        check_size(text, "the regex")
        compiled = LLMatcher.grammar_from_regex(text)
    for message in _validate(compiled):
        log.info("grammar (%s): %s", kind, message)
    return Grammar(kind, text, compiled, strict)


def _schema_value(source: Any) -> Any:
    if not isinstance(source, str):
        return source
    check_size(source, "the JSON schema")
    try:
        return json.loads(source)
    except ValueError as exc:
        raise GrammarError(f"the schema is not JSON: {exc}") from None
    except RecursionError:
        raise GrammarError("the schema nests too deeply to be read") from None


def _validate(compiled: str) -> list[str]:
    """llguidance's verdict on a compiled grammar, within ``grammar_limits.parser_limits``: its
    warnings, or a :class:`GrammarError` with its reason."""
    failed, messages = LLMatcher.validate_grammar_with_warnings(compiled, limits=parser_limits())
    if failed:
        raise GrammarError("; ".join(m for m in messages if "no tokenizer" not in m) or "invalid grammar")
    return messages


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


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """The vocabulary's special tokens (text -> id), as the grammar engine sees them: llguidance
    reads the tokenizer's added tokens and takes as special each one flagged ``special`` and each
    one of the form ``<...>`` (so a Qwen-style ``<tool_call>`` is special to it, flag or not).
    Plain text never produces one; a grammar names it ``<[id]>`` (:func:`lark_text`)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return {}
    return {added.content: int(i) for i, added in backend.get_added_tokens_decoder().items()
            if added.special or (added.content.startswith("<") and added.content.endswith(">"))}


def lark_text(text: str, special_ids: Mapping[str, int]) -> str:
    """``text`` as a sequence of Lark items that matches exactly it: string literals, with each
    special token of the vocabulary in it written ``<[id]>`` (a string literal cannot match a
    special token)."""
    found = sorted((s for s in special_ids if s and s in text), key=len, reverse=True)
    if not found:
        return _lark_literal(text) if text else ""
    items = []
    for part in re.split("(" + "|".join(re.escape(s) for s in found) + ")", text):
        if part in special_ids:
            items.append(f"<[{special_ids[part]}]>")
        elif part:
            items.append(_lark_literal(part))
    return " ".join(items)


def after_thinking(grammar: Grammar, start: str, end: str, *, opened: bool,
                   special_ids: Mapping[str, int] | None = None) -> Grammar:
    """``grammar`` for a model that may think first: a reasoning block (``start`` ... ``end``) and
    then the grammar, so the constraint applies to the answer and not to the thoughts. Inside the
    block any text is allowed until the end tag. ``opened``: the prompt has already opened the
    block, so the output starts inside it and must close it; otherwise the block is optional.
    ``special_ids`` (:func:`special_token_ids`): an end tag that is one special token closes the
    thoughts whatever text they hold (text never produces it); a text end tag closes them at its
    first occurrence.

    Written as two grammars in llguidance's top-level form: an outer Lark grammar that references
    the request's own grammar by name, which keeps the inner one exactly as it was compiled.
    """
    special_ids = special_ids or {}
    inner = _as_named_grammars(grammar.compiled)
    if end in special_ids:
        thoughts, rules = f"THOUGHTS <[{special_ids[end]}]>", ["THOUGHTS: /(.|\\n)*/"]
    elif any(s and s in end for s in special_ids):
        raise GrammarError(f"the end-of-thinking tag {end!r} mixes special tokens and text")
    else:  # a lazy lexeme with the tag as its suffix: the thoughts end at the first end tag
        thoughts, rules = "thoughts", [f"thoughts[suffix={_lark_literal(end)}]: /(.|\\n)*/"]
    # after the end tag, the blank line or two models write before their answer (bounded, so that a
    # model cannot spend its budget on whitespace)
    block = f"{thoughts} GAP" if opened else f"({lark_text(start, special_ids)} {thoughts} GAP)?"
    outer = "\n".join([f"start: {block} @{inner[0]['name']}", "GAP: /[ \\r\\n]{0,4}/", *rules]) + "\n"
    compiled = json.dumps({"grammars": [{"name": "after_thinking", "lark_grammar": outer}, *inner]})
    on_big_stack(lambda: _validate(compiled))
    return Grammar(grammar.kind, grammar.source, compiled, grammar.strict)


def _as_named_grammars(compiled: str) -> list[dict]:
    """A compiled grammar as llguidance's list of named grammars (Lark text becomes one)."""
    try:
        top = json.loads(compiled)
    except ValueError:
        top = None
    if not isinstance(top, dict) or "grammars" not in top:
        return [{"name": "answer", "lark_grammar": compiled}]
    grammars = [dict(g) for g in top["grammars"]]
    if not grammars[0].get("name") or grammars[0]["name"] == "after_thinking":
        grammars[0]["name"] = "answer"
    return grammars


def _lark_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
