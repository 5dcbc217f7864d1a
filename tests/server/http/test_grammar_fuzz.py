"""Fuzzing the grammar and tool-call surfaces: whatever a request's grammar, schema or tools hold,
compiling it (and building its matcher on the tiny llama's real tokenizer, and its first mask) either
works or is refused with a ``GrammarError``, in bounded time, and never takes the process down.

A stack overflow in llguidance's compiler is a SIGSEGV, not an exception, so the compiles run in a
worker process (this file run as a script): a worker that dies fails the example that killed it (and
a new one takes over); a compile that raises anything but ``GrammarError`` (a 500 in the server), or
that the ``grammar_stack`` deadline had to cut (a shape the static limits missed), fails too.

Shapes: ``$ref`` chains (the reported 1,000-link schema that killed the server is a fixed example),
deep schemas, GBNF and Lark rule chains (4,000 and 5,000 rules, also fixed), terminal chains and
doubling terminals, wide alternations, tool parameter schemas through ``tool_calls.call_grammar``,
and random GBNF, Lark, regexes and schemas.

The default suite runs a short derandomized slice (``MLXCEL_FUZZ_EXAMPLES``, default 3 examples per
shape, plus the fixed ones); ``make fuzz`` runs ``FUZZ_EXAMPLES`` (150) per shape.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("MLXCEL_FUZZ_EXAMPLES", "3"))
REPLY_TIMEOUT_S = 120  # a worker silent this long is hung (the compile deadline is 10 s)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 20,
                suppress_health_check=list(HealthCheck))


# -- the worker ------------------------------------------------------------------------------------

class Compiler:
    """A worker process compiling what it is sent, one JSON request a line, one JSON outcome a line
    back: ``ok``, ``refused`` (a GrammarError, with its message), ``exception`` (anything else);
    ``crash`` when the worker died on it, ``hang`` when it never answered."""

    def __init__(self, tokenizer_dir: Path):
        self.tokenizer_dir = tokenizer_dir
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(self.tokenizer_dir)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def run(self, request: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            return {"outcome": "hang"}
        return {"outcome": "crash", "returncode": self.proc.returncode}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def compiler(tiny_llama_dir):
    worker = Compiler(tiny_llama_dir)
    yield worker
    worker.close()


def check(compiler: Compiler, request: dict) -> None:
    result = compiler.run(request)
    what = f"{request['kind']} of {len(json.dumps(request))} bytes: {json.dumps(request)[:300]}"
    assert result["outcome"] in ("ok", "refused"), f"{result} for {what}"
    assert "took longer" not in result.get("message", ""), f"{result} for {what}"


# -- shapes ----------------------------------------------------------------------------------------

def ref_chain(links: int, wrap: str = "object") -> dict:
    """A schema whose ``$ref`` chain is ``links`` long, each link wrapped as ``wrap`` says."""
    def link(i: int) -> dict:
        ref = {"$ref": f"#/$defs/n{i + 1}"}
        return {"plain": ref, "object": {"type": "object", "properties": {"next": ref}},
                "nullable": {"anyOf": [ref, {"type": "null"}]}, "array": {"type": "array", "items": ref},
                "all": {"allOf": [ref]}}[wrap]
    return {"$ref": "#/$defs/n0", "$defs": {**{f"n{i}": link(i) for i in range(links)}, f"n{links}": {"type": "string"}}}


def rule_chain(syntax: str, rules: int, body: str = "{next}") -> str:
    """``rules`` rules each naming the next (``body`` says how), in GBNF or Lark."""
    define, first = ("{name} ::= ", "root ::= a0\n") if syntax == "gbnf" else ("{name}: ", "start: a0\n")
    if syntax == "lark-terminals":
        define, first = "{name}: ", "start: A0\n"
    name = "A{}" if syntax == "lark-terminals" else "a{}"
    lines = [define.format(name=name.format(i)) + body.format(next=name.format(i + 1), i=i) for i in range(rules)]
    return first + "\n".join(lines) + "\n" + define.format(name=name.format(rules)) + '"x"\n'


def as_request(kind: str, source) -> dict:
    return {"kind": kind, "source": source}


LITERAL = st.text(st.sampled_from('ab x"\\\n{}[]'), max_size=6).map(lambda t: json.dumps(t))
CLASS = st.sampled_from(["[a-z]", "[^\"\\\\]", "[0-9]", "[\\n\\t ]", "[a-]", "[]"])
REPEAT = st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,}", "{3,1}", ""])
RULE_NAMES = ["root", "a", "b", "c", "d"]


def expressions(names: list[str], atoms=st.nothing()):
    base = st.one_of(LITERAL, CLASS, st.sampled_from(names + ["undefined", "."]), atoms)
    return st.recursive(base, lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4).map(" ".join),
        st.lists(inner, min_size=2, max_size=4).map(" | ".join),
        inner.map(lambda e: f"({e})"),
        st.tuples(inner, REPEAT).map(lambda p: f"({p[0]}){p[1]}")), max_leaves=12)


@st.composite
def random_gbnf(draw) -> str:
    names = RULE_NAMES[:draw(st.integers(1, len(RULE_NAMES)))]
    return "\n".join(f"{name} ::= {draw(expressions(names))}" for name in names)


def schemas():
    scalar = st.one_of(
        st.sampled_from([{}, {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
                         {"type": "null"}, {"type": "hiccup"}, {"$ref": "#/$defs/d0"}, {"$ref": "#/$defs/d1"},
                         {"$ref": "#"}, {"$ref": "#/nowhere"}]),
        st.builds(lambda p: {"type": "string", "pattern": p}, st.text(st.sampled_from("ab.*+?()|[]{}0-9^$\\"),
                                                                      max_size=12)),
        st.builds(lambda lo, hi: {"type": "integer", "minimum": lo, "maximum": hi},
                  st.integers(-2**70, 2**70), st.integers(-2**70, 2**70)),
        st.builds(lambda n: {"type": "string", "minLength": n, "maxLength": n * 2}, st.integers(0, 10**9)),
        st.lists(st.text(max_size=4), min_size=1, max_size=4).map(lambda v: {"enum": v}))
    return st.recursive(scalar, lambda inner: st.one_of(
        st.dictionaries(st.sampled_from("abcde"), inner, max_size=4).flatmap(
            lambda props: st.builds(lambda req: {"type": "object", "properties": props, "required": req},
                                    st.lists(st.sampled_from(sorted(props) or ["z"]), unique=True))),
        st.builds(lambda items, n: {"type": "array", "items": items, "minItems": n}, inner, st.integers(0, 10**6)),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"anyOf": xs}),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"allOf": xs}),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"oneOf": xs})), max_leaves=16)


@st.composite
def random_schema(draw) -> dict:
    root = draw(schemas())
    root = dict(root) if isinstance(root, dict) else {"items": root}
    root["$defs"] = {"d0": draw(schemas()), "d1": draw(schemas())}
    return root


# -- the properties --------------------------------------------------------------------------------

@FUZZ
@example(as_request("json_schema", ref_chain(1000)))  # the schema that killed the server
@example(as_request("json_schema", ref_chain(2048, "plain")))
@given(st.builds(lambda n, wrap: as_request("json_schema", ref_chain(n, wrap)), st.integers(1, 3000),
                 st.sampled_from(["plain", "object", "nullable", "array", "all"])))
def test_ref_chains(compiler, request):
    check(compiler, request)


@FUZZ
@example(as_request("gbnf", rule_chain("gbnf", 4000)))  # the grammars that killed the server
@example(as_request("lark", rule_chain("lark", 5000)))
@example(as_request("lark", rule_chain("lark-terminals", 30, "{next} {next}")))
@given(st.builds(lambda syntax, n, body: as_request("lark" if syntax.startswith("lark") else "gbnf",
                                                    rule_chain(syntax, n, body)),
                 st.sampled_from(["gbnf", "lark", "lark-terminals"]), st.integers(1, 6000),
                 st.sampled_from(["{next}", '"(" {next} ")" | "q{i}"', "{next} {next}", '{next} "a" | {next} "b"',
                                  "({next})*", '"x" {next} | "y"'])))
def test_rule_chains(compiler, request):
    check(compiler, request)


@FUZZ
@given(st.builds(lambda kind, n, depth: as_request(kind, {"kind": kind, "n": n, "depth": depth}),
                 st.sampled_from(["gbnf-alt", "lark-alt", "regex-alt", "enum", "optional-props", "nested"]),
                 st.integers(1, 30000), st.integers(1, 140)))
def test_wide_and_deep(compiler, request):
    check(compiler, request)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["get_weather", "f", "a.b-c:d/e"]), st.one_of(random_schema(), st.builds(
    lambda n, wrap: ref_chain(n, wrap), st.integers(1, 2500), st.sampled_from(["plain", "object", "nullable"])))),
    min_size=1, max_size=3), st.booleans(), st.booleans())
def test_tool_parameter_schemas(compiler, tools, parallel, named):
    check(compiler, {"kind": "tools", "tools": [{"type": "function", "function": {"name": name, "parameters": schema}}
                                                for name, schema in tools],
                     "tool_choice": {"type": "function", "function": {"name": tools[0][0]}} if named else "required",
                     "parallel": parallel})


@FUZZ
@given(st.one_of(random_gbnf().map(lambda g: as_request("gbnf", g)),
                 random_schema().map(lambda s: as_request("lark", "start: x | %json " + json.dumps(s) + '\nx: "y"')),
                 random_schema().map(lambda s: as_request("json_schema", s)),
                 st.text(max_size=60).map(lambda t: as_request("regex", t)),
                 st.text(max_size=200).map(lambda t: as_request("gbnf", t)),
                 st.text(max_size=200).map(lambda t: as_request("lark", t)),
                 st.text(max_size=200).map(lambda t: as_request("json_schema", t))))
def test_random_grammars_and_schemas(compiler, request):
    check(compiler, request)


# -- the worker's side -----------------------------------------------------------------------------

def _wide_or_deep(spec: dict):
    """The generated source of a ``test_wide_and_deep`` case: (kind, source)."""
    kind, n, depth = spec["kind"], spec["n"], spec["depth"]
    if kind in ("gbnf-alt", "lark-alt"):
        body = " | ".join(f'"a{i}"' for i in range(n))
        return ("gbnf", f"root ::= {body}\n") if kind == "gbnf-alt" else ("lark", f"start: {body}\n")
    if kind == "regex-alt":
        return "regex", "|".join(f"a{i}" for i in range(n))
    if kind == "enum":
        return "json_schema", {"enum": [f"v{i}" for i in range(n)]}
    if kind == "optional-props":
        return "json_schema", {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n // 4)}}
    schema: dict = {"type": "string"}
    for i in range(depth):
        schema = {"type": "array", "items": schema} if i % 2 else {"type": "object", "properties": {"a": schema}}
    return "json_schema", schema


def _serve(tokenizer_dir: str) -> None:
    from transformers import PreTrainedTokenizerFast

    from mlxcel.engine.sampling.grammar import LARK, GrammarError, compile_grammar, special_token_ids
    from mlxcel.engine.sampling.grammar_matcher import new_matcher
    from mlxcel.server.http.chat.template_caps import CallLayout
    from mlxcel.server.http.chat.tool_calls import call_grammar, check_tools
    from mlxcel.server.runtime.errors import ApiError

    class Wrapped:  # what mlx-lm's tokenizer wrapper offers the grammar engine
        def __init__(self, hf):
            self._tokenizer = hf

    hf = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tokenizer, eos = Wrapped(hf), [hf.convert_tokens_to_ids("<|im_end|>")]
    special = special_token_ids(hf)
    layout = CallLayout(head='<|im_start|>\n{"name": "', mid='", "arguments": ', tail="}\n<|im_end|>",
                        between='}\n<|im_end|>\n<|im_start|>\n{"name": "')

    def compile_one(request: dict):
        if request["kind"] == "tools":
            tools, choice = check_tools(request["tools"], request["tool_choice"])
            text = call_grammar(layout, tools, choice, parallel=request["parallel"], special_ids=special)
            return compile_grammar(LARK, text) if text is not None else None
        kind, source = request["kind"], request["source"]
        if isinstance(source, dict) and set(source) == {"kind", "n", "depth"}:
            kind, source = _wide_or_deep(source)
        return compile_grammar(kind, source)

    for line in sys.stdin:
        started = time.monotonic()
        try:
            grammar = compile_one(json.loads(line))
            if grammar is not None:
                new_matcher(grammar, tokenizer, len(hf), eos).masks()
            out = {"outcome": "ok"}
        except (GrammarError, ApiError) as exc:
            out = {"outcome": "refused", "message": str(exc)[:500]}
        except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
            out = {"outcome": "exception", "message": f"{type(exc).__name__}: {exc}"[:500]}
        out["seconds"] = round(time.monotonic() - started, 3)
        print(json.dumps(out), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _serve(sys.argv[2])
