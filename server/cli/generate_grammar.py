"""Constrained decoding on ``mlxcel generate``: ``--grammar`` / ``--grammar-file`` (GBNF, or
llguidance's Lark) and ``-j`` / ``--json-schema`` / ``-jf`` / ``--json-schema-file``, llama.cpp's
spellings. The grammar is compiled before the model loads (a bad one is a usage error), and every
decode path, plain or speculative, runs under it and ends when it is complete."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlxcel.engine.sampling.grammar import GBNF, JSON_SCHEMA, Grammar, GrammarError, compile_grammar


def add_grammar_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("constrained decoding")
    src = group.add_mutually_exclusive_group()
    src.add_argument("--grammar", metavar="GRAMMAR", help="GBNF grammar (or llguidance Lark) the output must match")
    src.add_argument("--grammar-file", metavar="FNAME", type=Path, help="read the grammar from a file")
    src.add_argument("-j", "--json-schema", metavar="SCHEMA",
                     help='JSON schema the output must follow, e.g. \'{"type": "object"}\' for any JSON object')
    src.add_argument("-jf", "--json-schema-file", metavar="FILE", type=Path, help="read the JSON schema from a file")
    return parser


def read_grammar(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Grammar | None:
    """The grammar the flags give (None without one); a file that cannot be read or a grammar that
    does not compile is a usage error."""
    kind, text, flag = None, None, ""
    for value, path, k, name in ((args.grammar, args.grammar_file, GBNF, "--grammar"),
                                 (args.json_schema, args.json_schema_file, JSON_SCHEMA, "--json-schema")):
        if path is not None:
            try:
                value = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                parser.error(f"cannot read {name}-file {path}: {exc}")
        if value is not None:
            kind, text, flag = k, value, name
    if kind is None:
        return None
    try:
        return compile_grammar(kind, text)
    except GrammarError as exc:
        parser.error(f"{flag}: {exc}")
