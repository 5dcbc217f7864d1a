"""The limits on what a grammar may cost to compile (``grammar_limits``, ``grammar_rules``,
``grammar_gbnf``, ``grammar_stack``):

* each limit refuses the first shape past it with a ``GrammarError`` that names it, and takes the
  shape at the limit: ``$ref`` chains, rule chains (GBNF and Lark), terminal chains, terminals that
  double when inlined, nesting of schemas and of groups, optional properties, text size;
* recursion (a schema or a rule that refers back to itself) is no chain;
* shapes at the limits compile, and their matchers build, in a fresh process on the thread stack
  every server thread has (8 MiB on Linux): the compile's own big stack carries them (without it a
  1,000-link ``$ref`` chain is a SIGSEGV);
* GBNF converts as llguidance's converter does, in one sweep: a 2,000-rule chain of terminal rules
  with 3,000 rules beside it is refused in well under the 15 s that converter needs;
* a compile past the deadline is refused, and an error inside one reaches the caller.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from llguidance.gbnf_to_lark import gbnf_to_lark as llguidance_gbnf_to_lark

from mlxcel.engine.sampling import grammar_stack
from mlxcel.engine.sampling.grammar import GBNF, JSON_SCHEMA, LARK, REGEX, GrammarError, compile_grammar
from mlxcel.engine.sampling.grammar_gbnf import gbnf_to_lark
from mlxcel.engine.sampling.grammar_limits import (
    MAX_CHAIN,
    MAX_GROUP_NESTING,
    MAX_JSON_NESTING,
    MAX_SOURCE_BYTES,
    MAX_TERMINAL_CHAIN,
)


def ref_chain(links: int) -> dict:
    defs = {f"n{i}": {"type": "object", "properties": {"next": {"$ref": f"#/$defs/n{i + 1}"}}} for i in range(links)}
    return {"$ref": "#/$defs/n0", "$defs": {**defs, f"n{links}": {"type": "string"}}}


def plain_ref_chain(links: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    return {"$ref": "#/$defs/d0", "$defs": {**defs, f"d{links}": {"type": "string"}}}


def rule_chain(syntax: str, rules: int, name: str = "a") -> str:
    """The start rule, then ``rules + 1`` rules each naming the next: a chain of ``rules + 2``. The
    last refers to itself, so that no rule of the chain is a terminal (GBNF makes a rule of literals
    and terminals a terminal); with an upper-case ``name`` (Lark) they are ``rules + 1`` terminals."""
    arrow, start = (" ::= ", "root") if syntax == GBNF else (": ", "start")
    last = '"x"' if name.isupper() else f'"x" {name}{rules}?'
    lines = [f"{start}{arrow}{name}0", *(f"{name}{i}{arrow}{name}{i + 1}" for i in range(rules)),
             f"{name}{rules}{arrow}{last}"]
    return "\n".join(lines) + "\n"


def nested(levels: int) -> dict:
    """Arrays of arrays ... of strings: ``levels`` objects nested."""
    schema: dict = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def refused(kind, source, message):
    with pytest.raises(GrammarError, match=message):
        compile_grammar(kind, source)


def test_ref_chains():
    compile_grammar(JSON_SCHEMA, plain_ref_chain(MAX_CHAIN - 1))  # the root's $ref, then one a definition
    refused(JSON_SCHEMA, plain_ref_chain(MAX_CHAIN), rf"\$ref chain is {MAX_CHAIN + 1} links long; at most {MAX_CHAIN}")
    refused(JSON_SCHEMA, ref_chain(3000), r"\$ref chain is 3001 links long")
    # recursion is no chain: a tree of nodes, two schemas referring to each other
    tree = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                                                                "other": {"$ref": "#/$defs/leaf"}}},
                      "leaf": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
            "$ref": "#/$defs/node"}
    compile_grammar(JSON_SCHEMA, tree)
    compile_grammar(JSON_SCHEMA, {"type": "object", "properties": {"self": {"$ref": "#"}}})


def test_rule_chains_in_gbnf_and_lark():
    for syntax in (GBNF, LARK):
        compile_grammar(syntax, rule_chain(syntax, MAX_CHAIN - 2))
        refused(syntax, rule_chain(syntax, MAX_CHAIN - 1), f"chain of {MAX_CHAIN + 1} rules, each referring to the next")
        refused(syntax, rule_chain(syntax, 5000), "chain of 5002 rules")
    compile_grammar(GBNF, 'root ::= "(" root ")" | item\nitem ::= "x" item?')  # recursion


def test_terminals_chained_or_doubling():
    compile_grammar(LARK, rule_chain(LARK, MAX_TERMINAL_CHAIN - 1, name="A"))
    refused(LARK, rule_chain(LARK, MAX_TERMINAL_CHAIN, name="A"), f"chain of {MAX_TERMINAL_CHAIN + 1} terminals")
    doubling = "start: A0\n" + "".join(f"A{i}: A{i + 1} A{i + 1}\n" for i in range(30)) + 'A30: "x"\n'
    refused(LARK, doubling, "holds more than 131072 characters")
    # GBNF rules of literals only become terminals: the same holds after conversion
    refused(GBNF, "root ::= a0\n" + "".join(f"a{i} ::= a{i + 1} a{i + 1}\n" for i in range(30)) + 'a30 ::= "x"\n',
            "holds more than 131072 characters")


def test_nesting_size_and_optional_properties():
    compile_grammar(JSON_SCHEMA, nested(MAX_JSON_NESTING))
    refused(JSON_SCHEMA, nested(MAX_JSON_NESTING + 1), f"nests objects and arrays {MAX_JSON_NESTING + 1} levels deep")
    refused(JSON_SCHEMA, "[" * 5000 + "]" * 5000, "nests")  # as text: no RecursionError either
    compile_grammar(GBNF, "root ::= " + "(" * MAX_GROUP_NESTING + '"x"' + ")" * MAX_GROUP_NESTING)
    refused(GBNF, "root ::= " + "(" * 200 + '"x"' + ")" * 200, "nests groups")
    refused(LARK, "start: " + "(" * 200 + '"x"' + ")" * 200, "nests groups 200 levels deep")
    alternation = "root ::= " + " | ".join(f'"a{i}"' for i in range(20000))
    refused(GBNF, alternation, f"the gbnf grammar is {len(alternation)} bytes; at most {MAX_SOURCE_BYTES}")
    refused(REGEX, "a" * (MAX_SOURCE_BYTES + 1), "the regex is")
    refused(JSON_SCHEMA, {"enum": ["v" * 100] * 2000}, "the JSON schema is")
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1001)}}
    refused(JSON_SCHEMA, wide, "too many optional properties")
    compile_grammar(JSON_SCHEMA, {**wide, "required": [f"p{i}" for i in range(1001)]})  # required ones cost little
    compile_grammar(JSON_SCHEMA, {"type": "array", "prefixItems": [dict(wide, properties=dict(list(
        wide["properties"].items())[:500])) for _ in range(4)]})  # four objects of 500


def test_a_tool_call_grammar_embeds_schemas_within_the_limits():
    text = 'start: "call " %json {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": %s}\n'
    defs = plain_ref_chain(MAX_CHAIN + 1)["$defs"]
    refused(LARK, text.replace("%s", json.dumps(defs)), r"\$ref chain is")


AT_THE_LIMITS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from test_grammar_limits import ref_chain, rule_chain
    from transformers import PreTrainedTokenizerFast
    from mlxcel.engine.sampling.grammar import compile_grammar
    from mlxcel.engine.sampling.grammar_matcher import new_matcher

    class Wrapped:
        _tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[2])

    for kind, source in [("json_schema", ref_chain(1000)), ("json_schema", ref_chain(1800)),
                         ("gbnf", rule_chain("gbnf", 2040)), ("lark", rule_chain("lark", 2040))]:
        matcher = new_matcher(compile_grammar(kind, source), Wrapped(), len(Wrapped._tokenizer), [2])
        matcher.masks()
    print("ok")
""")


def test_shapes_at_the_limits_compile_on_an_8_mib_stack(tiny_llama_dir):
    """In a fresh process (a stack overflow would end it), with the main thread's stack at 8 MiB."""
    here = str(Path(__file__).parent)
    run = subprocess.run(["bash", "-c", 'ulimit -s 8192 && exec "$0" -c "$1" "$2" "$3"', sys.executable,
                          AT_THE_LIMITS, here, str(tiny_llama_dir)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.returncode, run.stderr[-2000:])


def test_gbnf_converts_as_llguidance_does_in_one_sweep():
    for text in ['root ::= "a" | b\nb ::= [0-9]+ ("." [0-9]+)?', 'root ::= item ("," item)*\nitem ::= "x" | "(" root ")"',
                 rule_chain(GBNF, 300), "# a comment\nroot ::= \"\\u00e9\" x\nx ::= [^\"\\\\]"]:
        ours = sorted(line for line in gbnf_to_lark(text).splitlines() if line.strip())
        assert ours == sorted(line for line in llguidance_gbnf_to_lark(text).splitlines() if line.strip())
    # terminal rules in a chain written top-down: llguidance's converter sweeps once a rule (15 s here)
    chain = "root ::= a0\n" + "".join(f"a{i} ::= a{i + 1}\n" for i in range(2040)) + 'a2040 ::= "x"\n'
    text = chain + "".join(f'f{i} ::= "y{i}" f{i}?\n' for i in range(3000))
    started = time.monotonic()
    refused(GBNF, text, "chain of 2041 terminals")
    assert time.monotonic() - started < 5.0


def test_the_deadline_and_errors_of_a_compile(monkeypatch):
    monkeypatch.setattr(grammar_stack, "DEADLINE_S", 0.2)
    with pytest.raises(GrammarError, match="took longer than 0.2 s"):
        grammar_stack.on_big_stack(lambda: time.sleep(2))
    with pytest.raises(ZeroDivisionError):
        grammar_stack.on_big_stack(lambda: 1 / 0)
    assert grammar_stack.on_big_stack(lambda: 42) == 42
