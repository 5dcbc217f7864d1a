"""What a chat template can do, learned by rendering it, once per template.

llama-server reads a template's capabilities by running it over probe conversations and
watching which variables it reads. Python's Jinja cannot watch reads, so mlxcel renders the same
kind of probes with marker strings and reads the markers back from the output:

* ``caps``: the ``chat_template_caps`` of ``/props`` (tools, tool calls, object arguments,
  parallel calls, system role, string and typed content, reasoning effort, preserved reasoning);
* ``call_layout``: how the template writes an assistant's tool call, as the literal text around
  the function name and the JSON arguments of one call and of two calls in a row (what
  ``tool_calls`` parses with when mlx-lm has no parser for the template, and what a grammar
  forcing a call is built from);
* ``think``: the reasoning markers the template writes around an assistant's
  ``reasoning_content`` (``<think>``/``</think>``, ``[THINK]``/``[/THINK]``...).

A probe that fails to render only means the template lacks that capability.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from functools import lru_cache

import jinja2
import jinja2.meta

from mlxcel.server.http.chat.template import apply_template
from mlxcel.server.runtime.errors import ApiError

log = logging.getLogger(__name__)

USER = "ZQXUSERZQX"
SYSTEM = "ZQXSYSTEMZQX"
CONTENT = "ZQXCONTENTZQX"
REASONING = "ZQXREASONINGZQX"
TOOL_NAME = "zqxtool"
CALL_NAMES = ("zqxcalla", "zqxcallb")
CALL_IDS = ("call00001", "call00002")  # nine alphanumerics: some templates insist (Mistral)
ID = "zqxid"  # what a call id becomes in a CallLayout piece
ARG_KEY, ARG_VALUE = "zqxarg", "zqxvalue"
TOOL_RESULT = "ZQXRESULTZQX"

PROBE_TOOLS = [{
    "type": "function",
    "function": {
        "name": TOOL_NAME, "description": "zqx description",
        "parameters": {"type": "object", "properties": {ARG_KEY: {"type": "string", "description": "zqx arg"}},
                       "required": [ARG_KEY]},
    },
}]


@dataclass(frozen=True)
class ThinkMarkers:
    """The tags around reasoning, as the template (or the vocabulary) writes them."""

    start: str
    end: str


@dataclass(frozen=True)
class CallLayout:
    """How the template renders tool calls, as literal text around the varying parts.

    Split view (every layout has it): one call renders as ``head + NAME + mid + ARGUMENTS +
    tail``, two in a row as ``head + NAME + mid + ARGUMENTS + between + NAME + mid + ARGUMENTS +
    tail`` (``between`` None when the template renders only one call). Object view (when one call
    is a JSON object): ``start + OBJECT + end``, two as ``start + OBJECT + glue + OBJECT + end``,
    the name and the arguments at ``name_path`` / ``args_path`` in the object. Call ids the
    template prints appear in the pieces as ``ID``."""

    head: str
    mid: str
    tail: str
    between: str | None = None
    start: str = ""
    end: str = ""
    glue: str | None = None
    name_path: tuple[str, ...] | None = None
    args_path: tuple[str, ...] | None = None

    @property
    def is_object(self) -> bool:
        return self.name_path is not None


@dataclass
class TemplateInfo:
    caps: dict[str, bool] = field(default_factory=dict)
    call_layout: CallLayout | None = None
    think: ThinkMarkers | None = None
    object_arguments: bool = False  # assistant tool-call arguments go to the template as objects


def _call(i: int, object_args: bool) -> dict:
    args = {ARG_KEY: ARG_VALUE} if object_args else json.dumps({ARG_KEY: ARG_VALUE})
    return {"id": CALL_IDS[i], "type": "function", "function": {"name": CALL_NAMES[i], "arguments": args}}


def _history(calls: list[dict]) -> list[dict]:
    return [{"role": "user", "content": USER}, {"role": "assistant", "content": "", "tool_calls": calls}]


class _Renderer:
    def __init__(self, tokenizer, template: str):
        self.tokenizer = tokenizer
        self.template = template

    def __call__(self, messages: list[dict], add_generation_prompt: bool = False, **extra) -> str | None:
        try:
            return apply_template(self.tokenizer, self.template, messages, add_generation_prompt,
                                  {"enable_thinking": True, **extra})
        except ApiError:
            return None


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _region(with_calls: str, with_text: str) -> str:
    """The text ``with_calls`` has where ``with_text`` has the content marker: the rendered calls
    (never starting or ending inside a ``<...>`` tag)."""
    p = _common_prefix(with_calls, with_text)
    s = _common_prefix(with_calls[p:][::-1], with_text[p:][::-1])
    end = len(with_calls) - s
    if with_calls.rfind("<", 0, p) > with_calls.rfind(">", 0, p):
        p = with_calls.rfind("<", 0, p)
    close, opening = with_calls.find(">", end), with_calls.find("<", end)
    if close >= 0 and (opening < 0 or close < opening) and "<" in with_calls[p:end]:
        end = close + 1
    return with_calls[p:end]


def _json_at(text: str, value, before: int) -> tuple[int, int] | None:
    """The span of a JSON value equal to ``value`` that starts at or after ``before``."""
    decoder = json.JSONDecoder()
    start = before
    while True:
        start = text.find("{", start)
        if start < 0:
            return None
        try:
            got, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            got, end = None, start + 1
        if got == value:
            return start, end
        start += 1


def _path_to(obj, value, path=()) -> tuple[str, ...] | None:
    if obj == value:
        return path
    if isinstance(obj, dict):
        for key, child in obj.items():
            found = _path_to(child, value, (*path, key))
            if found is not None:
                return found
    return None


def _call_object(region: str, name_at: int, name: str = CALL_NAMES[0]) -> tuple[int, int, tuple, tuple] | None:
    """The JSON object in ``region`` that holds the call's name and arguments: (start, end, the
    name's key path, the arguments' key path)."""
    decoder = json.JSONDecoder()
    for start in [i for i in range(name_at) if region[i] == "{"]:
        try:
            obj, end = decoder.raw_decode(region, start)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or end <= name_at:
            continue
        name_path = _path_to(obj, name)
        args_path = _path_to(obj, {ARG_KEY: ARG_VALUE})
        if args_path is None:  # arguments rendered as a JSON string
            args_path = _path_to(obj, json.dumps({ARG_KEY: ARG_VALUE}))
        if name_path is not None and args_path is not None:
            return start, end, name_path, args_path
    return None


def _layout(one: str, two: str | None) -> CallLayout | None:
    """The call layout from the rendering of one call and of two (call ids already replaced by
    ``ID``), or None when the arguments are not rendered as JSON (a template with an argument
    syntax of its own: mlx-lm's parser for it, if any, is the only way to read it)."""
    name_at = one.find(CALL_NAMES[0])
    if name_at < 0:
        return None
    args = _json_at(one, {ARG_KEY: ARG_VALUE}, name_at + len(CALL_NAMES[0]))
    if args is None:
        return None
    head, mid, tail = one[:name_at], one[name_at + len(CALL_NAMES[0]):args[0]], one[args[1]:]
    between = glue = None
    spans = None
    if two is not None:
        a, b = two.find(CALL_NAMES[0]), two.find(CALL_NAMES[1])
        first = _json_at(two, {ARG_KEY: ARG_VALUE}, a + len(CALL_NAMES[0])) if a >= 0 else None
        second = _json_at(two, {ARG_KEY: ARG_VALUE}, b + len(CALL_NAMES[1])) if b >= 0 else None
        if first and second and two.startswith(head) and two.endswith(tail) and first[1] <= b:
            between = two[first[1]:b]
            spans = (a, b)
    found = _call_object(one, name_at)
    if found is None:
        return CallLayout(head, mid, tail, between)
    start, end, name_path, args_path = found
    if spans is not None:
        obj1 = _call_object(two, spans[0])
        obj2 = _call_object(two[obj1[1]:], spans[1] - obj1[1], CALL_NAMES[1]) if obj1 else None
        if obj1 and obj2 and two[:obj1[0]] == one[:start] and two.endswith(one[end:]):
            glue = two[obj1[1]:obj1[1] + obj2[0]]
    return CallLayout(head, mid, tail, between, start=one[:start], end=one[end:], glue=glue, name_path=name_path,
                      args_path=args_path)


_TAG = re.compile(r"<[^<>]*>|\[[^\[\]]*\]")


def _opener(end: str, before: str) -> str | None:
    """The opening tag that pairs with ``end``'s first tag, when ``before`` ends with it."""
    first = _TAG.match(end)
    tag = first.group() if first else end
    for old, new in (("</", "<"), ("[/", "["), ("END", "START"), ("End", "Start"), ("end", "begin"),
                     ("end", "start"), ("close", "open")):
        if old in tag:
            candidate = tag.replace(old, new, 1)
            if before.endswith(candidate):
                return candidate
    return None


def _think_markers(render: _Renderer) -> ThinkMarkers | None:
    """The markers around ``reasoning_content`` in a final assistant message, as rendered: the
    end tag is what separates the reasoning from the content; the start tag is the opening tag
    that pairs with it, or the text the rendering adds before the reasoning (when it is one tag)."""
    messages = [{"role": "user", "content": USER},
                {"role": "assistant", "content": CONTENT, "reasoning_content": REASONING}]
    text = render(messages)
    if not text or REASONING not in text or CONTENT not in text:
        return None
    at, content_at = text.index(REASONING), text.index(CONTENT)
    if content_at < at:
        return None
    end = text[at + len(REASONING):content_at].strip()
    before = text[:at].rstrip()
    start = _opener(end, before) if end else None
    if start is None:
        plain = render([{"role": "user", "content": USER}, {"role": "assistant", "content": CONTENT}]) or ""
        start = text[_common_prefix(text, plain):at].strip()
        if USER in start or "\n" in start or not _TAG.fullmatch(start or "-"):
            return None
    if not start or not end or start == end:
        return None
    return ThinkMarkers(start, end)


def _used_variables(template: str) -> set[str]:
    try:
        return jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateError:
        return set()


@lru_cache(maxsize=8)
def _probe_cached(tokenizer, template: str) -> TemplateInfo:
    render = _Renderer(tokenizer, template)
    info = TemplateInfo()
    caps = {key: False for key in ("supports_object_arguments", "supports_parallel_tool_calls",
                                   "supports_preserve_reasoning", "supports_reasoning_effort",
                                   "supports_string_content", "supports_system_role", "supports_tool_calls",
                                   "supports_tools", "supports_typed_content")}
    plain = render([{"role": "user", "content": USER}], True)
    caps["supports_string_content"] = bool(plain) and USER in plain
    typed = render([{"role": "user", "content": [{"type": "text", "text": USER}]}], True)
    caps["supports_typed_content"] = bool(typed) and USER in typed and "'type'" not in typed
    system = render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], True)
    caps["supports_system_role"] = bool(system) and SYSTEM in system
    with_tools = render([{"role": "user", "content": USER}], True, tools=PROBE_TOOLS)
    caps["supports_tools"] = bool(with_tools) and TOOL_NAME in with_tools
    text = render([{"role": "user", "content": USER}, {"role": "assistant", "content": CONTENT}], tools=PROBE_TOOLS)
    for object_args in (True, False):
        one = render(_history([_call(0, object_args)]), tools=PROBE_TOOLS)
        if one and CALL_NAMES[0] in one:
            caps["supports_tool_calls"] = True
            info.object_arguments = object_args and ARG_VALUE in one and f"'{ARG_VALUE}'" not in one
            two = render(_history([_call(0, object_args), _call(1, object_args)]), tools=PROBE_TOOLS)
            caps["supports_parallel_tool_calls"] = bool(two) and CALL_NAMES[1] in two
            if text:
                regions = [_region(r, text).replace(CALL_IDS[0], ID).replace(CALL_IDS[1], ID) if r else None
                           for r in (one, two if caps["supports_parallel_tool_calls"] else None)]
                info.call_layout = _layout(*regions)
            break
    caps["supports_object_arguments"] = info.object_arguments
    caps["supports_reasoning_effort"] = "reasoning_effort" in _used_variables(template)
    earlier = [{"role": "user", "content": USER}, {"role": "assistant", "content": CONTENT,
                                                    "reasoning_content": REASONING},
               {"role": "user", "content": USER}, {"role": "assistant", "content": CONTENT,
                                                    "reasoning_content": "later"},
               {"role": "user", "content": USER}]
    preserved = render(earlier, True, preserve_thinking=True, clear_thinking=False)
    caps["supports_preserve_reasoning"] = bool(preserved) and REASONING in preserved
    info.caps = caps
    info.think = _think_markers(render)
    return info


def probe_template(tokenizer, template: str | None) -> TemplateInfo:
    """What ``template`` can do (cached per tokenizer and template)."""
    if not template:
        return TemplateInfo()
    return _probe_cached(tokenizer, template)
