"""Upstream's glob patterns for the file tools: ``*`` and ``?`` stop at ``/``, ``**`` crosses it,
``[...]`` is a class (``!`` negates it, ``a-z`` ranges). Python's ``fnmatch`` lets ``*`` cross
``/``, so the patterns are translated here, once each."""

from __future__ import annotations

import functools
import posixpath
import re


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = i + 1
            if end < n and pattern[end] == "!":
                end += 1
            if end < n and pattern[end] in "]-":
                end += 1
            while end < n and pattern[end] != "]":
                end += 1
            if end >= n:  # no closing bracket: a literal '['
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1:end]
            negated = body.startswith("!")
            body = body[1:] if negated else body
            items = []
            j = 0
            while j < len(body):
                if j + 2 < len(body) and body[j + 1] == "-":
                    items.append(f"{re.escape(body[j])}-{re.escape(body[j + 2])}")
                    j += 3
                else:
                    items.append(re.escape(body[j]))
                    j += 1
            out.append(f"[{'^' if negated else ''}{''.join(items)}]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def glob_match(pattern: str, text: str) -> bool:
    return _compile(pattern).fullmatch(text) is not None


def path_glob_match(pattern: str, rel_path: str) -> bool:
    """A pattern without ``/`` matches the basename at any depth; one with ``/`` matches the whole
    relative path, anchored with ``**/`` unless it starts with ``**`` or ``/`` already."""
    if "/" not in pattern:
        return glob_match(pattern, posixpath.basename(rel_path))
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)
