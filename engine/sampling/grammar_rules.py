"""The shape of a grammar's rules, for ``grammar_limits``: its longest chain of rule references, its
terminals (their chain, and their size once inlined into one another), how deeply it nests groups,
and the JSON schemas a Lark grammar embeds (``%json``).

llguidance compiles rule references recursively, so a chain ``a0: a1``, ``a1: a2`` ... thousands
long overflows its stack; it inlines terminals into one regex, so ``A0: A1 A1``, ``A1: A2 A2`` ...
doubles at each step, and a long chain of terminals makes a regex nested as deep, whose lexer takes
seconds to build. This reads those shapes off the text first, without recursion, so that such a
grammar is refused with a clear message. The reading is lexical (definitions, the names their bodies
use, strings, regexes, comments and special tokens skipped), not a full parse: llguidance stays the
judge of whether the grammar is valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mlxcel.engine.sampling.grammar_error import GrammarError
from mlxcel.engine.sampling.grammar_limits import (
    MAX_CHAIN,
    MAX_GROUP_NESTING,
    MAX_TERMINAL_CHAIN,
    MAX_TERMINAL_CHARS,
    check_schema,
)

# one Lark token (llguidance's dialect: `//` and `#` comments, `-` in names); what is not a name, a
# literal, a bracket, a newline or a directive only needs skipping
_LARK_TOKEN = re.compile(r"""
    (?P<skip>[ \t\r\f]+ | //[^\n]* | \#[^\n]* | <[^<>\s]*> | @[\w-]+)
  | (?P<literal>"(?:[^"\\\n]|\\.)*"i? | /(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<nl>\n)
  | (?P<directive>%\w+)
  | (?P<name>\w[\w-]*)
  | (?P<open>[(\[])
  | (?P<close>[)\]])
  | (?P<other>.)
""", re.X | re.S)
# a rule or terminal definition at the start of a line: `name:`, `?name:`, `NAME.2:`, `name[lazy]:`
_LARK_DEFINITION = re.compile(r'[ \t]*[?!]?(\w[\w-]*)(?:\.-?\d+)?(?:\[(?:"(?:[^"\\\n]|\\.)*"|[^\]"\n])*\])?[ \t]*:(?!:)')
_JSON = json.JSONDecoder()


@dataclass
class _Rule:
    """One definition as the limits see it: the names its body uses (repeats kept) and how many
    characters of literals (strings, regexes) it holds."""

    refs: list[str] = field(default_factory=list)
    literal_chars: int = 0


def check_lark(text: str) -> None:
    """A Lark grammar within the limits: its rule chain, its terminals (chain and inlined size), its
    group nesting, every ``%json`` schema."""
    rules, deepest = _read_lark(text)
    check_group_nesting(deepest)
    check_rule_chain({name: rule.refs for name, rule in rules.items()})
    terminals = {name: rule for name, rule in rules.items() if _is_terminal(name)}
    chain = longest_chain({name: rule.refs for name, rule in terminals.items()})
    if chain > MAX_TERMINAL_CHAIN:
        raise GrammarError(f"the grammar has a chain of {chain} terminals, each referring to the next; at most "
                           f"{MAX_TERMINAL_CHAIN} are accepted")
    for name, size in _inlined_sizes(terminals).items():
        if size > MAX_TERMINAL_CHARS:
            raise GrammarError(f"the terminal {name} holds more than {MAX_TERMINAL_CHARS} characters of literals "
                               "once the terminals it names are inlined; at most that many are accepted")


def _read_lark(text: str) -> tuple[dict[str, _Rule], int]:
    """Each definition of a Lark text (name -> :class:`_Rule`) and its deepest group nesting."""
    rules: dict[str, _Rule] = {}
    current: _Rule | None = None
    depth = deepest = 0
    pos, line_start = 0, True
    while pos < len(text):
        if line_start and depth == 0:
            definition = _LARK_DEFINITION.match(text, pos)
            if definition is not None:
                current = rules.setdefault(definition.group(1), _Rule())
                pos, line_start = definition.end(), False
                continue
        token = _LARK_TOKEN.match(text, pos)
        kind, pos = token.lastgroup, token.end()
        line_start = kind == "nl" or (line_start and kind == "skip")
        if kind == "name" and current is not None:
            current.refs.append(token.group())
        elif kind == "literal" and current is not None:
            current.literal_chars += len(token.group())
        elif kind == "open":
            depth += 1
            deepest = max(deepest, depth)
        elif kind == "close":
            depth = max(0, depth - 1)
        elif kind == "directive":
            pos = _directive_argument(text, pos, token.group())
    return rules, deepest


def _directive_argument(text: str, pos: int, directive: str) -> int:
    """Past a directive's JSON argument (``%json {...}``, ``%llguidance {...}``, ``%regex {...}``),
    checking a ``%json`` schema on the way."""
    start = pos
    while start < len(text) and text[start] in " \t":
        start += 1
    if start >= len(text) or text[start] not in "{[":
        return pos
    try:
        value, end = _JSON.raw_decode(text, start)
    except (ValueError, RecursionError):
        return pos  # not JSON: llguidance says what is wrong with it
    if directive == "%json":
        check_schema(value)
    return end


def _is_terminal(name: str) -> bool:
    """Lark's convention: a terminal's name is upper case (``_NL`` too), a rule's lower case."""
    return name.lstrip("_")[:1].isupper()


def _inlined_sizes(terminals: Mapping[str, _Rule]) -> dict[str, int]:
    """How many literal characters each terminal holds once the terminals it names are inlined (as
    often as it names them), capped just past the limit. Dependencies first, without recursion; a
    cycle (which llguidance refuses) counts nothing."""
    sizes: dict[str, int] = {}
    for root in terminals:
        if root in sizes:
            continue
        on_stack = {root}
        stack = [(root, iter(terminals[root].refs))]
        while stack:
            name, refs = stack[-1]
            for ref in refs:
                if ref in terminals and ref not in sizes and ref not in on_stack:
                    on_stack.add(ref)
                    stack.append((ref, iter(terminals[ref].refs)))
                    break
            else:
                stack.pop()
                on_stack.discard(name)
                total = terminals[name].literal_chars + sum(sizes.get(r, 0) for r in terminals[name].refs)
                sizes[name] = min(total, MAX_TERMINAL_CHARS + 1)
    return sizes


def check_group_nesting(deepest: int) -> None:
    if deepest > MAX_GROUP_NESTING:
        raise GrammarError(f"the grammar nests groups {deepest} levels deep; at most {MAX_GROUP_NESTING} are accepted")


def check_rule_chain(graph: Mapping[str, Iterable[str]]) -> None:
    """``graph`` (each rule's name -> the names its body uses) has no chain of rule references longer
    than :data:`MAX_CHAIN`."""
    chain = longest_chain(graph)
    if chain > MAX_CHAIN:
        raise GrammarError(f"the grammar has a chain of {chain} rules, each referring to the next; at most "
                           f"{MAX_CHAIN} are accepted")


def longest_chain(graph: Mapping[str, Iterable[str]]) -> int:
    """The most rules on one path of references (names the graph does not define are not rules; a
    reference back to a rule on the path is recursion, not counted). Depth first, without recursion,
    each rule's longest chain remembered."""
    best: dict[str, int] = {}
    for root in graph:
        if root in best:
            continue
        on_path = {root}
        stack = [(root, iter(graph[root]), 0)]
        while stack:
            name, refs, found = stack[-1]
            for ref in refs:
                if ref not in graph or ref in on_path:
                    continue
                if ref in best:
                    found = max(found, best[ref])
                    continue
                stack[-1] = (name, refs, found)
                on_path.add(ref)
                stack.append((ref, iter(graph[ref]), 0))
                break
            else:
                stack.pop()
                on_path.discard(name)
                best[name] = found + 1
                if stack:
                    parent, parent_refs, parent_found = stack[-1]
                    stack[-1] = (parent, parent_refs, max(parent_found, best[name]))
    return max(best.values(), default=0)
