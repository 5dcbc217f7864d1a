"""A request's output constraint: ``grammar`` (GBNF), ``json_schema`` and ``response_format``, read
as llama-server reads them, compiled into the engine's :class:`Grammar` (``engine.sampling.grammar``),
with upstream's 400s for what cannot be compiled.

How upstream chooses, and so how this module does:

* ``response_format``: ``text`` (or no type) constrains nothing; ``json_object`` takes its ``schema``
  (any JSON object without one); ``json_schema`` takes ``json_schema.schema`` (any object without
  one; ``json_schema.strict: true`` refuses keywords the engine cannot enforce, as OpenAI's strict
  mode does, where otherwise they are ignored); any other type is a 400. A schema from
  ``response_format`` replaces a ``json_schema`` field.
* the chat route refuses ``json_schema`` together with a non-empty ``grammar``, and ``grammar``
  together with tools that may be called; a schema then wins over a grammar. The completion routes
  take the ``grammar`` when both are given (upstream's native parameter order).
* an empty schema ``{}`` means any JSON object.
* a request with none of these runs under the server's ``--grammar`` / ``--json-schema``, if any.

:func:`constrain` is the one call for a caller that builds its own grammar (a forced tool call):
it sets a request's grammar from Lark, GBNF or a JSON schema, with the same errors.

A grammar or schema past the engine's compile limits (``engine.sampling.grammar_limits``: size,
``$ref`` and rule chains, nesting) is the same 400, its message naming the limit; nothing a request
sends can overflow the compiler's stack or hold a core for long.

A chat request whose reasoning is split from its content (``reasoning_format`` not ``none``, and
thinking tags known) runs its grammar after the thinking (:func:`after_reasoning`): the thoughts
stay free text and the constraint holds for the answer, as upstream applies a response format to
what follows the reasoning. The thinking block is part of the same grammar (not a second
mechanism that switches the mask on), so the mask is still one function of the emitted prefix and
every speculative acceptance rule keeps its guarantee.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.sampling.grammar import GBNF, JSON_SCHEMA, Grammar, GrammarError, after_thinking, compile_grammar
from mlxcel.server.http.schema import SamplingFields
from mlxcel.server.runtime.errors import invalid
from mlxcel.server.runtime.task import GenerationOptions

BAD_GRAMMAR = "Failed to initialize samplers: failed to parse grammar"
BAD_SCHEMA_FIELD = "Field 'json_schema': \"json_schema\": JSON schema conversion failed:\n"  # native parameters
BAD_SCHEMA_CHAT = "Unable to generate parser for this template. Automatic parser generation failed: "
BAD_SCHEMA_LEGACY = "JSON schema conversion failed:\n"  # a chat request rendered without Jinja


def request_grammar(req: SamplingFields, *, chat: bool = False, jinja: bool = True,
                    tools_called: bool = False, default: Grammar | None = None) -> Grammar | None:
    """The grammar a request runs under (``default`` when it names none). ``tools_called``: a chat
    request whose tools may be called (tools given, ``tool_choice`` not ``none``)."""
    grammar_text = req.grammar or ""
    schema, strict = _response_format(req.response_format, req.json_schema)
    if chat:
        if req.json_schema is not None and grammar_text:
            raise invalid("Cannot use both json_schema and grammar")
        if tools_called and req.grammar is not None:
            raise invalid("Cannot use custom grammar constraints with tools.")
    elif req.grammar is not None and req.response_format is None:
        schema = None  # the native parameters: a grammar field wins over json_schema (an empty one: no grammar)
    if schema is not None:
        prefix = (BAD_SCHEMA_CHAT if jinja else BAD_SCHEMA_LEGACY) if chat else BAD_SCHEMA_FIELD
        return schema_grammar(schema, strict=strict, prefix=prefix)
    if grammar_text:
        return gbnf_grammar(grammar_text)
    return default


def _response_format(fmt: Any, json_schema: Any) -> tuple[Any, bool]:
    """The schema the request asks for and whether it is strict (upstream's reading of
    ``response_format`` over the ``json_schema`` field)."""
    schema = json_schema
    if fmt is None:
        return schema, False
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid(f'response_format type must be one of "text" or "json_object", but got: {kind}')
    if kind == "json_object" and ("schema" in fmt or not schema):
        return fmt.get("schema", {}), False
    if kind == "json_schema":
        wrapper = fmt.get("json_schema")
        wrapper = wrapper if isinstance(wrapper, dict) else {}
        return wrapper.get("schema", {}), wrapper.get("strict") is True
    return schema, False


def schema_grammar(schema: Any, *, strict: bool = False, prefix: str = BAD_SCHEMA_FIELD) -> Grammar:
    """A JSON schema (an object or a boolean; ``{}`` is any object) as a grammar, or a 400 whose
    message starts with ``prefix``."""
    if isinstance(schema, dict) and not schema:
        schema = {"type": "object"}
    if not isinstance(schema, (dict, bool)):
        raise invalid(prefix + "schema must be an object or boolean")
    try:
        return compile_grammar(JSON_SCHEMA, schema, strict=strict)
    except GrammarError as exc:
        raise invalid(prefix + str(exc)) from None


def gbnf_grammar(text: str) -> Grammar:
    """A GBNF grammar (or llguidance Lark, recognised as upstream does), or upstream's 400."""
    try:
        return compile_grammar(GBNF, text)
    except GrammarError as exc:
        raise invalid(f"{BAD_GRAMMAR}: {exc}") from None


def constrain(options: GenerationOptions, kind: str, source: Any) -> None:
    """Constrain a request to a grammar of ``kind`` (``lark``, ``gbnf``, ``json_schema``, ``regex``;
    see ``engine.sampling.grammar.compile_grammar``), replacing any it had; a grammar that does not
    compile is upstream's 400."""
    if kind == JSON_SCHEMA:
        options.grammar = schema_grammar(source)
        return
    try:
        options.grammar = compile_grammar(kind, source)
    except GrammarError as exc:
        raise invalid(f"{BAD_GRAMMAR}: {exc}") from None


def after_reasoning(grammar: Grammar, start: str, end: str, *, opened: bool, special_ids: dict[str, int]) -> Grammar:
    """``grammar`` behind a thinking block delimited by ``start`` / ``end`` (``opened``: the
    generation prompt has opened it already); ``special_ids``: the vocabulary's special tokens."""
    try:
        return after_thinking(grammar, start, end, opened=opened, special_ids=special_ids)
    except GrammarError as exc:
        raise invalid(f"{BAD_GRAMMAR}: {exc}") from None
