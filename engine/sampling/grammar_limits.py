"""What a request's grammar or schema may cost to compile, checked before llguidance sees it.

A grammar comes from the request, so its compile must stay bounded whatever it holds: no input
may overflow the compiler's stack (a SIGSEGV that ends the server; ``grammar_stack`` is the safety
net under these checks) or keep a core busy for long. Each limit is a ``GrammarError`` that names
it (the server's 400). The limits, and why each is where it is (times on a 2-core x86 CPU, compile
and matcher on a 65k-token vocabulary):

* :data:`MAX_SOURCE_BYTES` (128 KiB) of grammar text, regex or schema (as compact JSON). Grammars
  written by hand are a few KiB (llama.cpp's own examples: under 10 KiB) and large schemas tens of
  KiB (the reported 1,000-link ``$ref`` chain is 70 KiB, and compiles); the costly shapes grow
  faster than linearly (a 1 MiB GBNF alternation ``"a0" | "a1" | ...`` took 33 s), and at this
  size the worst measured (a 13,000-way alternation) compiles in 0.7 s and builds its matcher in 0.3.
* :data:`MAX_CHAIN` (2,048): the longest chain of ``$ref`` hops through a schema, and of rule
  references through a GBNF or Lark grammar (``a0 ::= a1``, ``a1 ::= a2`` ...). llguidance recurses
  once per link, up to about 10 KiB of stack a ``$ref`` link, so about 900 links overflow an 8 MiB
  thread stack. Realistic schemas and grammars have chains of tens (OpenAI's strict mode allows 10
  levels of nesting; llama.cpp's converter writes a rule or two a level); 2,048 is twice the
  reported 1,000-link chain, which llama-server compiles, and so does mlxcel. A cycle (a recursive
  schema or rule) is no chain: it is compiled once.
* :data:`MAX_TERMINAL_CHAIN` (256) terminals each naming the next, and :data:`MAX_TERMINAL_CHARS`
  (128 KiB) of literals in one terminal once the terminals it names are inlined: llguidance inlines
  terminals into one regex, so a chain of 2,000 makes a regex nested as deep whose lexer takes
  seconds (16 s) to build, and ``A0: A1 A1``, ``A1: A2 A2`` ... doubles at each step. GBNF rules of
  literals become terminals too. Hand-written terminals nest a few deep.
* :data:`MAX_JSON_NESTING` (100) levels of objects and arrays in a schema: llguidance's JSON
  reader refuses about 125 (a cryptic "recursion limit exceeded"); this says it plainly, with room
  for several times OpenAI's 10 levels of nesting (a level is an object or two).
* :data:`MAX_GROUP_NESTING` (64) levels of parentheses in a GBNF or Lark grammar (llguidance takes
  about 25 in Lark; GBNF's converter flattens redundant groups first, and recurses in Python).
* :data:`MAX_OPTIONAL_PAIRS` (1,000,000): llguidance's compile grows with the square of an object's
  optional properties (5,000 in one object take 6 s, 1,000 a fifth of a second), so the squares,
  summed over a schema's objects, may reach one object of 1,000 (or four of 500...). OpenAI's
  strict mode allows 5,000 properties in a whole schema, every one required: required ones cost
  little, and are not counted.

:func:`parser_limits` adds llguidance's own limits (``LLParserLimits``), its defaults: they bound
the lexer's construction and each mask step (a grammar of nested counted repetitions such as
``/(x{1000}){1000}/`` fails at its first mask, after about a second). Less lexer fuel would fail it
sooner, but also refuses a 1,600-way ``anyOf``. Its errors are kept short."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import unquote

from llguidance import LLParserLimits

from mlxcel.engine.sampling.grammar_error import GrammarError

MAX_SOURCE_BYTES = 128 * 1024
MAX_CHAIN = 2048
MAX_JSON_NESTING = 100
MAX_GROUP_NESTING = 64
MAX_OPTIONAL_PAIRS = 1000 * 1000
MAX_TERMINAL_CHAIN = 256
MAX_TERMINAL_CHARS = MAX_SOURCE_BYTES


def parser_limits() -> LLParserLimits:
    """llguidance's limits for every compile and matcher: its defaults (lexer fuel ~20 ms, 50,000
    Earley items and ~15 ms of lexer work per mask step), with errors that do not dump the parser's
    state into the response."""
    return LLParserLimits(verbose_errors=False)


def check_size(text: str, what: str) -> None:
    """``text`` (a grammar, a regex, a schema's JSON) is at most :data:`MAX_SOURCE_BYTES`."""
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > MAX_SOURCE_BYTES else len(text)
    if size > MAX_SOURCE_BYTES:
        raise GrammarError(f"{what} is {size} bytes; at most {MAX_SOURCE_BYTES} are accepted")


def check_schema(schema: Any) -> None:
    """A JSON schema within the limits: nesting, optional properties, ``$ref`` chain
    (see the module docstring). Walks it without recursion, so any input is safe to check."""
    nesting, pairs = _shape(schema)
    if nesting > MAX_JSON_NESTING:
        raise GrammarError(f"the schema nests objects and arrays {nesting} levels deep; at most "
                           f"{MAX_JSON_NESTING} are accepted")
    if pairs > MAX_OPTIONAL_PAIRS:
        raise GrammarError(f"the schema has too many optional properties: an object with n of them costs n*n to "
                           f"compile; its objects together cost {pairs}, and at most {MAX_OPTIONAL_PAIRS} (one "
                           f"object with {math.isqrt(MAX_OPTIONAL_PAIRS)}) are accepted")
    chain = _longest_ref_chain(schema)
    if chain > MAX_CHAIN:
        raise GrammarError(f"the schema's $ref chain is {chain} links long; at most {MAX_CHAIN} are accepted")


def _shape(schema: Any) -> tuple[int, int]:
    """The deepest nesting of objects and arrays, and the sum over its objects of the square of their
    optional properties."""
    deepest, pairs = 0, 0
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            pairs += _optional_properties(node) ** 2
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_NESTING:  # deeper is refused anyway: no need to walk it all
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest, pairs


def _optional_properties(node: dict) -> int:
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return 0
    required = node.get("required")
    required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    return sum(1 for name in properties if name not in required)


def _longest_ref_chain(root: Any) -> int:
    """The most ``$ref`` hops on one path through the schema (into nested schemas and through local
    references), a reference back to a schema already on the path (recursion) not counted. A
    depth-first walk, without recursion, that remembers each node's longest chain."""
    if not isinstance(root, (dict, list)):
        return 0
    best: dict[int, int] = {}
    on_path: set[int] = {id(root)}
    stack = [(root, iter(_edges(root, root)), 0, 0)]  # node, its edges, weight of the edge into it, best so far
    while stack:
        node, edges, weight, found = stack[-1]
        for child, hop in edges:
            key = id(child)
            if key in on_path:
                continue
            if key in best:
                found = max(found, best[key] + hop)
                continue
            stack[-1] = (node, edges, weight, found)
            on_path.add(key)
            stack.append((child, iter(_edges(child, root)), hop, 0))
            break
        else:
            stack.pop()
            on_path.discard(id(node))
            best[id(node)] = found
            if stack:
                parent, parent_edges, parent_weight, parent_found = stack[-1]
                stack[-1] = (parent, parent_edges, parent_weight, max(parent_found, found + weight))
            continue
    return best[id(root)]


def _edges(node: Any, root: Any):
    """A node's children (objects and arrays, no hop) and, for a ``$ref`` it can resolve, its target
    (one hop)."""
    children = node.values() if isinstance(node, dict) else node
    for child in children:
        if isinstance(child, (dict, list)):
            yield child, 0
    if isinstance(node, dict) and isinstance(node.get("$ref"), str):
        target = _resolve(node["$ref"], root)
        if isinstance(target, (dict, list)):
            yield target, 1


def _resolve(ref: str, root: Any) -> Any:
    """A local reference (``#`` or a JSON pointer ``#/...``) in ``root``; None otherwise (anchors,
    other documents: llguidance judges those)."""
    if not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    if not pointer:
        return root
    if not pointer.startswith("/"):
        return None
    node = root
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
