"""Tool calls: the request's ``tools`` / ``tool_choice`` checked, and the model's output read
back into OpenAI ``tool_calls``, in the call syntax of the template in force.

Which syntax: mlx-lm's own choice of tool parser for the template
(``mlx_lm.tokenizer_utils._infer_tool_parser``, the one ``mlx_lm.server`` uses) with that
parser's start/end markers and ``parse_tool_call``; where mlx-lm has no parser for the template
(Llama 3.x's bare JSON, DeepSeek R1/V3's ``<｜tool▁call▁begin｜>``, Command R, functionary,
MiniMax-M1, Granite 3, Apriel, Nemotron Nano...), the layout the template itself renders a call
in (``template_caps.CallLayout``, learned by rendering a probe call), read with a JSON decoder:
one generic reader, not one hand-written parser per family. A template whose arguments are not
JSON and that mlx-lm does not know has no parser: its tools are still rendered, and its output
stays content.

``tool_choice``: ``auto`` (default) parses calls; ``none`` renders the tools but parses nothing,
as upstream; ``required`` and a named function (``{"type": "function", "function": {"name": ...}}``)
reach the template as ``tool_choice``, and the output is forced to be a call (that one) by a grammar:
:func:`call_grammar` writes it in the template's own layout, special-token markers as tokens, the
tool's ``parameters`` schema for the arguments (``plan`` applies it, after any thinking block); a
template whose call layout is not JSON is only asked, and its output parsed as under ``auto``.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

from mlxcel.engine.sampling.grammar import JSON_WHITESPACE, lark_text
from mlxcel.server.http.chat.template_caps import ID, CallLayout, TemplateInfo
from mlxcel.server.runtime.errors import invalid

try:  # mlx-lm's choice of parser from a template (what mlx_lm.server does)
    from mlx_lm.tokenizer_utils import _infer_tool_parser
except ImportError:  # pragma: no cover - mlx-lm moved it: only the template-derived reader is left
    _infer_tool_parser = None

log = logging.getLogger(__name__)
_ID_ALPHABET = string.ascii_letters + string.digits
NAME = re.compile(r"[A-Za-z0-9_.\-:/]+")


def call_id() -> str:
    """A fresh tool call id (upstream's: 32 random alphanumerics)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(32))


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON text
    id: str

    def to_json(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}, "id": self.id}


def _arguments_text(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return None
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return None


class CallSyntax:
    """Reads tool calls out of a model's (post-reasoning) output. ``triggers``: text any call
    starts with, held back from a stream while it may still become one."""

    triggers: tuple[str, ...] = ()
    source: str = ""
    # the call object without its markers, read when it is the whole output and names a tool of the
    # request (small models drop the tags: Qwen2.5-Coder-0.5B answers a bare {"name": ..., "arguments": ...})
    bare_fallback: CallSyntax | None = None

    def find(self, text: str) -> int:
        """Where the first call starts in ``text`` (-1: none)."""
        hits = [i for i in (text.find(t) for t in self.triggers if t) if i >= 0]
        return min(hits, default=-1)

    def parse(self, text: str, tools: list | None, final: bool = True) -> tuple[list[ToolCall], int]:
        """The complete calls at the start of ``text`` (which starts where a call would) and where
        the text they take ends. Before the output is ``final`` a call is complete once its own
        closing is there; a call that does not parse ends the list."""
        raise NotImplementedError


def _call_of(item: Any) -> ToolCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = _arguments_text(item.get("arguments", {}))
    if args is None:
        return None
    return ToolCall(item["name"], args, item.get("id") if isinstance(item.get("id"), str) else call_id())


class MlxLmSyntax(CallSyntax):
    """One of mlx-lm's tool parsers: the text between its start and end markers, parsed by it
    (a parser whose end marker is empty takes the rest of the output, once it is complete)."""

    def __init__(self, name: str, module):
        self.source = f"mlx-lm {name}"
        self.start = module.tool_call_start
        self.end = module.tool_call_end
        self.triggers = (self.start,)
        self._parse = module.parse_tool_call

    def parse(self, text: str, tools: list | None, final: bool = True) -> tuple[list[ToolCall], int]:
        calls: list[ToolCall] = []
        pos = used = 0
        while True:
            start = text.find(self.start, pos)
            if start < 0 or text[pos:start].strip():
                break  # no further call, or prose before it
            body_from = start + len(self.start)
            end = text.find(self.end, body_from) if self.end else -1
            if end < 0 and not final:
                break  # not closed yet
            body = text[body_from:end] if end >= 0 else text[body_from:]
            try:
                parsed = self._parse(body, tools)
            except Exception:  # the parser says it is no call (any error: it is not our code)
                break
            items = [_call_of(item) for item in (parsed if isinstance(parsed, list) else [parsed])]
            if not items or None in items:
                break
            calls += items
            pos = used = end + len(self.end) if end >= 0 else len(text)
            if end < 0:
                break
        return calls, used


def _loose(literal: str) -> str:
    """A regex for a literal piece of a layout: any run of whitespace matches any other (or none),
    a call id matches any id."""
    parts = []
    for piece in re.split(r"(\s+|" + ID + ")", literal):
        if not piece:
            continue
        if piece.isspace():
            parts.append(r"\s*")
        elif piece == ID:
            parts.append(r"[\w\-]+")
        else:
            parts.append(re.escape(piece))
    return "".join(parts)


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


class LayoutSyntax(CallSyntax):
    """The layout the template renders calls in (``template_caps.CallLayout``), read back with a
    JSON decoder. Object layouts (a call is a JSON object between start and end markers, as
    Hermes, Llama 3.x, Command R, Mistral Nemo) decode each object and read the name and the
    arguments at their keys; split layouts (name, then JSON arguments, as DeepSeek, functionary,
    Kimi) match the literal pieces around them, whitespace-tolerant."""

    source = "the template's own call layout"

    def __init__(self, layout: CallLayout, bare: bool = False):
        self.layout = layout
        self.bare = bare  # the call object alone, without the layout's start and end markers
        if layout.is_object:
            start = "" if bare else layout.start.strip()
            self.triggers = (start,) if start else ("{",)
        else:
            head = layout.head.strip()
            self.triggers = (head.split(ID)[0].strip() or head,) if head else ()
        self._decoder = json.JSONDecoder()

    def find(self, text: str) -> int:
        if self.triggers == ("{",):  # a bare JSON call: only as the whole output (as upstream reads Llama 3.x)
            stripped = text.lstrip()
            return len(text) - len(stripped) if stripped.startswith("{") else -1
        return super().find(text)

    def parse(self, text: str, tools: list | None, final: bool = True) -> tuple[list[ToolCall], int]:
        if self.bare and not final:
            return [], 0  # read only once the output is complete: it must be the whole output
        calls, used = self._objects(text) if self.layout.is_object else self._split(text)
        if self.bare:  # the whole output, and only an object naming a tool of the request
            names = {(t.get("function") or {}).get("name") for t in tools or []}
            if not calls or any(c.name not in names for c in calls) or text[used:].strip():
                return [], 0
        return calls, used

    def _closing(self, text: str, pos: int, literal: str) -> int:
        """``pos`` past the layout's closing ``literal`` when it follows (whitespace-tolerant)."""
        if not literal.strip():
            return pos
        m = re.compile(r"\s*" + _loose(literal.strip())).match(text, pos)
        return m.end() if m else pos

    def _objects(self, text: str) -> tuple[list[ToolCall], int]:
        lay = self.layout
        start = "" if self.bare else lay.start.strip()
        m = re.compile(r"\s*" + _loose(start)).match(text) if start else None
        pos = m.end() if m else 0
        glue = re.compile(r"\s*" + _loose(lay.glue.strip()) + r"\s*") if lay.glue and lay.glue.strip() and not self.bare \
            else None
        calls, used = [], 0
        while True:
            pos = len(text) - len(text[pos:].lstrip())
            try:
                obj, pos = self._decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break
            call = _call_of({"name": _get(obj, lay.name_path), "arguments": _get(obj, lay.args_path),
                             "id": obj.get("id") if isinstance(obj, dict) else None})
            if call is None:
                break
            calls.append(call)
            used = pos if self.bare else self._closing(text, pos, lay.end)
            nxt = glue.match(text, pos) if glue else None
            if nxt is None:
                break
            pos = nxt.end()
        return calls, used

    def _split(self, text: str) -> tuple[list[ToolCall], int]:
        lay = self.layout
        head = re.compile(r"\s*" + _loose(lay.head.strip()) + r"\s*")
        mid = re.compile(r"\s*" + _loose(lay.mid.strip()) + r"\s*") if lay.mid.strip() else re.compile(r"\s*")
        between = re.compile(r"\s*" + _loose(lay.between.strip()) + r"\s*") if lay.between and lay.between.strip() \
            else None
        m = head.match(text)
        calls, used = [], 0
        if m is None:
            return calls, used
        pos = m.end()
        while True:
            name = NAME.match(text, pos)
            sep = mid.match(text, name.end()) if name else None
            if sep is None:
                break
            try:
                args, pos = self._decoder.raw_decode(text, sep.end())
            except json.JSONDecodeError:
                break
            call = _call_of({"name": name.group(), "arguments": args})
            if call is None:
                break
            calls.append(call)
            used = self._closing(text, pos, lay.tail)
            nxt = between.match(text, pos) if between else None
            if nxt is None:
                break
            pos = nxt.end()
        return calls, used


def call_syntax(template: str | None, tokenizer, info: TemplateInfo) -> CallSyntax | None:
    """How tool calls are read for ``template``: mlx-lm's parser for it, else its own layout."""
    if not template or not info.caps.get("supports_tool_calls"):
        return None
    name = None
    if _infer_tool_parser is not None:
        class _Template:  # what mlx-lm's inference reads: the template in force and the vocabulary
            chat_template = template

            @staticmethod
            def get_vocab():
                return tokenizer.get_vocab()

        try:
            name = _infer_tool_parser(_Template())
        except Exception:  # its heuristics are not ours to trust blindly
            name = None
    layout = info.call_layout
    bare = LayoutSyntax(layout, bare=True) if layout is not None and layout.is_object and layout.start.strip() \
        else None
    if name is not None:
        try:
            syntax = MlxLmSyntax(name, importlib.import_module(f"mlx_lm.tool_parsers.{name}"))
            syntax.bare_fallback = bare
            return syntax
        except ImportError:
            log.warning("mlx-lm names the tool parser %r but has no such module", name)
    if layout is not None:
        syntax = LayoutSyntax(layout)
        syntax.bare_fallback = bare
        return syntax
    log.warning("the chat template renders tool calls in a syntax mlx-lm has no parser for and whose arguments "
                "are not JSON: tools are rendered, but calls in the output stay content")
    return None


# -- the request -----------------------------------------------------------------------------

TOOL_CHOICES = ("auto", "none", "required")


def check_tools(tools: Any, tool_choice: Any) -> tuple[list | None, str | dict]:
    """``tools`` and ``tool_choice`` as upstream accepts them (plus a named function): the tools
    (None when there are none) and the choice (a string, or the named function's name as
    ``{"name": ...}``). Every shape is checked here, once, for the chat route and for the Responses
    and Anthropic routes that translate into it: anything else is a 400 that says what is wrong."""
    tools = _checked_tools(tools)
    if tool_choice is None:
        return tools, "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise invalid(f"Invalid tool_choice: {tool_choice}")  # upstream's words
        return tools, tool_choice
    return tools, {"name": _named_choice(tool_choice, tools)}


def _checked_tools(tools: Any) -> list | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("Field 'tools': must be an array of {\"type\": \"function\", \"function\": {...}} objects")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid(f"Field 'tools': tool {i} must be an object with 'function': {{'name': ...}}")
        if tool.get("type", "function") != "function":
            raise invalid(f"Field 'tools': tool {i} has the unsupported type {str(tool['type'])[:64]!r} "
                          "(only function tools are)")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise invalid(f"Field 'tools': the parameters of tool {i} must be a JSON schema object")
    return tools or None


def _named_choice(choice: Any, tools: list | None) -> str:
    """The name a ``{"type": "function", "function": {"name": ...}}`` choice names, a tool of ``tools``."""
    expected = 'expected "auto", "none", "required" or {"type": "function", "function": {"name": ...}}'
    if not isinstance(choice, dict):
        raise invalid(f"Invalid tool_choice: {expected}")
    if choice.get("type", "function") != "function":
        raise invalid(f"Invalid tool_choice: the type {str(choice['type'])[:64]!r} is not supported; {expected}")
    fn = choice.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise invalid(f"Invalid tool_choice: 'function' must be an object with a 'name' string; {expected}")
    name = fn["name"]
    if not any(t["function"]["name"] == name for t in tools or []):
        raise invalid(f"Invalid tool_choice: no tool named {name[:64]!r} in 'tools'")
    return name


def history_messages(messages: list[dict], object_arguments: bool) -> list[dict]:
    """Assistant ``tool_calls`` in the history as the template takes them: JSON-string arguments
    become objects for a template that reads them as objects (as upstream does)."""
    out = []
    for i, msg in enumerate(messages):
        calls = msg.get("tool_calls")
        if msg.get("role") == "assistant" and calls is not None:
            if not isinstance(calls, list):
                raise invalid(f"Failed to parse messages: 'tool_calls' of message {i} must be an array")
            fixed = []
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise invalid(f"Failed to parse messages: a tool call of message {i} has no function name")
                args = fn.get("arguments")
                if object_arguments and isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        raise invalid(f"Failed to parse messages: the arguments of a tool call of message {i} "
                                      "are not valid JSON") from None
                fixed.append({**call, "type": call.get("type", "function"), "function": {**fn, "arguments": args}})
            msg = {**msg, "tool_calls": fixed}
        out.append(msg)
    return out


# -- forcing a call --------------------------------------------------------------------------

def _pieces(literal: str, special_ids: dict[str, int]) -> list[str]:
    """A layout piece as Lark items: literals (special tokens as ``<[id]>``), with an id terminal
    where the template prints ids."""
    items = []
    for i, part in enumerate(literal.split(ID)):
        if i:
            items.append("CALL_ID")
        if part:
            items.append(lark_text(part, special_ids))
    return items


def call_grammar(layout: CallLayout, tools: list, tool_choice: str | dict = "required",
                 parallel: bool = False, special_ids: dict[str, int] | None = None) -> str | None:
    """The grammar (llguidance's Lark dialect) that forces the output to be tool calls in the
    template's own layout: ``head NAME mid ARGUMENTS tail``, each tool's ``parameters`` schema
    written as ``%json{...}``; with ``parallel`` (and a template that renders two calls in a
    row) one or more calls joined by the layout's ``between``. ``tool_choice`` a named function
    (``{"name": ...}``) allows only that tool. None when the template's layout cannot be written
    as a grammar (its arguments are not JSON). ``special_ids``: the vocabulary's special tokens
    (``grammar.special_token_ids``), which the layout's markers may be.

    After every complete call the output may end (end-of-sequence is allowed), after at most a few
    blank characters: a model that writes the newline its template puts between two calls and then
    means to stop must be able to (as upstream's grammar allows space after a call), or it is held
    to writing call after call until its token budget runs out. Where ``between`` is the tail, blank
    characters and the head again (Hermes / Qwen ``<tool_call>`` blocks), the calls are complete
    blocks with that gap between them, so the newline never commits to a next call."""
    special_ids = special_ids or {}
    if layout is None:
        return None
    wanted = tool_choice.get("name") if isinstance(tool_choice, dict) else None
    chosen = [t["function"] for t in tools if wanted is None or t["function"]["name"] == wanted]
    if not chosen:
        return None
    rules, alternatives = [], []
    for i, fn in enumerate(chosen):
        schema = dict(fn.get("parameters") or {"type": "object"})
        # the arguments' JSON spaced as a model writes it (llama-server's whitespace), unless the
        # schema sets its own
        schema.setdefault("x-guidance", {"whitespace_pattern": JSON_WHITESPACE, "lenient": True})
        arguments = "%json" + json.dumps(schema, separators=(",", ":"))
        rules.append(_join(f"call_{i}:", lark_text(fn["name"], {}), *_pieces(layout.mid, special_ids), arguments))
        alternatives.append(f"call_{i}")
    head, tail = _pieces(layout.head, special_ids), _pieces(layout.tail, special_ids)
    gap = _blank_between_blocks(layout) if parallel else None
    if gap is not None:  # complete calls, blank characters between them
        lines = [_join("start:", *head, "call", *tail, "(" + _join("GAP", *head, "call", *tail) + ")*", "GAP")]
    else:
        repeat = ""
        if parallel and layout.between is not None:
            repeat = "(" + _join(*_pieces(layout.between, special_ids), "call") + ")*"
        lines = [_join("start:", *head, "call", repeat, *tail, "GAP")]
    lines += ["call: " + " | ".join(alternatives), *rules, f"GAP: /[ \\t\\r\\n]{{0,{max(4, len(gap or ''))}}}/"]
    if any(ID in piece for piece in (layout.head, layout.mid, layout.tail, layout.between or "")):
        lines.append('CALL_ID: /[A-Za-z0-9]{9}/')
    return "\n".join(lines) + "\n"


def _blank_between_blocks(layout: CallLayout) -> str | None:
    """The blank characters between two calls when the layout's ``between`` is its tail, those
    characters and its head again (None otherwise, or when the head itself opens with blank
    characters, which a gap before it could not tell apart)."""
    between, head, tail = layout.between, layout.head, layout.tail
    if between is None or not head or head[0].isspace() or not between.startswith(tail) or not between.endswith(head):
        return None
    gap = between[len(tail):len(between) - len(head)]
    return gap if len(between) >= len(tail) + len(head) and not gap.strip() else None


def _join(*items: str) -> str:
    """Lark items, one space apart (literals keep their own spaces)."""
    return " ".join(item for item in items if item)
