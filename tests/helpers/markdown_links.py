"""A Markdown document's relative links and the anchors its headings make, as GitHub renders them:
what a link such as ``benchmarks.md#grammar-masks`` must find to lead somewhere."""

from __future__ import annotations

import re

from markdown_spans import prose_lines

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def relative_links(text: str) -> list[tuple[int, str]]:
    """``(line number, target)`` of every link outside code blocks that is not a URL or a mail address."""
    out = []
    for number, line in enumerate(prose_lines(text), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                out.append((number, target))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (hyphens and
    underscores kept), each space a hyphen."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated heading's later anchors get ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out
