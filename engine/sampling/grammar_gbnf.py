"""GBNF (llama.cpp's grammar format) to llguidance's Lark, in time linear in the rules.

llguidance's converter (``llguidance.gbnf_to_lark``) parses the GBNF, then marks the rules that are
terminals (a rule of literals and other terminal rules becomes a Lark terminal) by sweeping every
rule until nothing changes; a sweep settles only the rules whose references a previous sweep settled,
so a chain of rules written top-down (``root ::= a0``, ``a0 ::= a1`` ...) takes one sweep per rule:
4,000 rules take a second, 8,000 ten. Here the same parser and the same marking run on the rules
put in dependency order first (each rule after the rules it refers to), so one sweep settles them
all; the output is the converter's, its rules in that order. The rule chain and group nesting are
checked against ``grammar_limits`` on the way, before anything recursive runs on them.

Text that is already Lark (``%llguidance`` or a ``start:`` rule) is returned as it is, as upstream
and llguidance's ``any_to_lark`` do.
"""

from __future__ import annotations

from llguidance.gbnf_to_lark import (
    AlternativeNode,
    ASTNode,
    GrammarParser,
    RuleNode,
    RuleRefNode,
    is_lark_syntax,
    resolve,
)

from mlxcel.engine.sampling.grammar_error import GrammarError
from mlxcel.engine.sampling.grammar_rules import check_group_nesting, check_rule_chain


def gbnf_to_lark(text: str) -> str:
    """``text`` (GBNF, or Lark as it is) as Lark; a :class:`GrammarError` with the converter's reason
    (and position) when it is not valid GBNF."""
    if is_lark_syntax(text):
        return text
    try:
        rules = GrammarParser().parse(text)
    except RecursionError:
        raise GrammarError("the grammar nests groups too deeply") from None
    except Exception as exc:  # the parser raises plain exceptions with a position
        raise GrammarError(str(exc)) from None
    graph = {name: _references(rule) for name, rule in rules.items()}
    check_rule_chain(graph)
    ordered = {name: rules[name] for name in _dependency_order(graph)}
    try:
        resolve(ordered)
    except RecursionError:
        raise GrammarError("the grammar nests groups too deeply") from None
    except Exception as exc:  # an undefined rule, no root: the converter's own words
        raise GrammarError(str(exc)) from None
    body = "\n".join(str(rule) for rule in sorted(ordered.values(), key=lambda r: r.order))
    return "%llguidance {}\n\n" + body + "\n"


def _references(rule: RuleNode) -> list[str]:
    """The rule names a rule's body uses, in order, read without recursion; the group nesting
    checked on the way."""
    names, deepest = [], 0
    stack: list[tuple[ASTNode, int]] = [(rule.alternatives, 0)]
    while stack:
        node, groups = stack.pop()
        deepest = max(deepest, groups)
        if isinstance(node, RuleRefNode):
            names.append(node.name)
        stack.extend((child, groups + isinstance(child, AlternativeNode)) for child in reversed(node.children()))
    check_group_nesting(deepest)
    return names


def _dependency_order(graph: dict[str, list[str]]) -> list[str]:
    """Every rule after the rules it refers to (a reference back to a rule being visited, recursion,
    aside), the rules otherwise in their written order. Depth first, without recursion."""
    order: list[str] = []
    seen: set[str] = set()
    for root in graph:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(graph[root]))]
        while stack:
            name, refs = stack[-1]
            for ref in refs:
                if ref in graph and ref not in seen:
                    seen.add(ref)
                    stack.append((ref, iter(graph[ref])))
                    break
            else:
                stack.pop()
                order.append(name)
    return order
