"""The inline code spans of a Markdown document: what its prose names in backticks.

Fenced blocks (```` ``` ```` / ``~~~``) and indented code blocks (four spaces after a blank line)
are left out: they hold commands and snippets, not names the text claims exist. A span may wrap
over a line break, as Markdown allows; its line is the line it starts on."""

from __future__ import annotations

import re

FENCE = re.compile(r"^\s*(```|~~~)")
# a run of backticks, then text up to the same run (never across a blank line, as in Markdown)
SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)


def prose_lines(text: str) -> list[str]:
    """The document's lines with every code-block line blanked (line numbers kept)."""
    out: list[str] = []
    fenced = False
    indented = False
    previous_blank = True
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        blank = not line.strip()
        if not fenced and not blank:
            indented = line.startswith("    ") and (previous_blank or indented)
        if fenced or (indented and not blank):
            out.append("")
        else:
            out.append(line)
        previous_blank = blank
    return out


def code_spans(text: str) -> list[tuple[int, str]]:
    """``(line number, span text)`` for every inline code span outside code blocks, in order; a
    span that wraps has its line break read as a space, and ``` `` `x` `` ``` spans are unwrapped."""
    prose = "\n".join(prose_lines(text))
    spans = []
    for m in SPAN.finditer(prose):
        body = " ".join(m.group(2).split("\n"))
        if len(m.group(1)) > 1:
            body = body.strip()
        spans.append((prose.count("\n", 0, m.start()) + 1, body))
    return spans
