"""``edit_file``'s replacement rules, as upstream applies them.

Every ``old_text`` is looked up in the original content (not after the earlier edits). When one is
not found exactly, matching falls back to a normalized form of both texts: trailing spaces and
tabs dropped per line, smart quotes, dashes and unusual spaces folded to ASCII. Uniqueness is
always judged on the normalized text (a whitespace-only duplicate still counts); edits may not
overlap; after a fuzzy match, the lines no edit touched keep their original bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

_FOLD = {
    **{c: "'" for c in "\u2018\u2019\u201a\u201b"},
    **{c: '"' for c in "\u201c\u201d\u201e\u201f"},
    **{chr(c): "-" for c in range(0x2010, 0x2016)},
    "\u2212": "-",
    "\u00a0": " ",
    **{chr(c): " " for c in range(0x2002, 0x200b)},
    "\u202f": " ", "\u205f": " ", "\u3000": " ",
}
_TABLE = str.maketrans(_FOLD)


class EditError(Exception):
    """The tool's ``{"error": ...}`` answer."""


def normalize(content: str) -> str:
    """Each line with its trailing whitespace dropped and its punctuation folded (line count kept)."""
    return "\n".join(line.rstrip(" \t\r").translate(_TABLE) for line in content.split("\n"))


def _count(content: str, needle: str) -> int:
    if not needle:
        return 0
    count = pos = 0
    while (pos := content.find(needle, pos)) != -1:
        count += 1
        pos += len(needle)
    return count


@dataclass
class _Match:
    edit_index: int
    start: int
    length: int
    new_text: str


def _apply(content: str, matches: list[_Match], offset: int = 0) -> str:
    out = content
    for m in reversed(matches):
        i = m.start - offset
        out = out[:i] + m.new_text + out[i + m.length:]
    return out


def _split_nl(content: str) -> list[str]:
    parts = content.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _spans(content: str) -> list[tuple[int, int]]:
    spans, offset = [], 0
    for line in _split_nl(content):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    return spans


def _preserving(original: str, base: str, matches: list[_Match]) -> str:
    """Apply matches found in the normalized ``base``; untouched lines come from ``original``."""
    original_lines = _split_nl(original)
    spans = _spans(base)
    groups: list[list] = []  # [start_line, end_line (exclusive), matches]
    for m in matches:
        start_line = next((i for i, (s, e) in enumerate(spans) if s <= m.start < e), 0)
        end_line = start_line
        while end_line < len(spans) and spans[end_line][1] < m.start + m.length:
            end_line += 1
        end_line = min(end_line + 1, len(spans))
        if groups and start_line < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], end_line)
            groups[-1][2].append(m)
        else:
            groups.append([start_line, end_line, [m]])
    out, line = [], 0
    for start_line, end_line, group in groups:
        out.extend(original_lines[line:start_line])
        lo, hi = spans[start_line][0], spans[end_line - 1][1]
        out.append(_apply(base[lo:hi], group, lo))
        line = end_line
    out.extend(original_lines[line:])
    return "".join(out)


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str:
    """The new content, or :class:`EditError` with upstream's message."""
    fuzzy = False
    norm_original = normalize(original)
    for i, (old, _new) in enumerate(edits):
        if old in original:
            continue
        if normalize(old) not in norm_original:
            raise EditError(f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                            f"content exactly")
        fuzzy = True
    base = norm_original if fuzzy else original
    matches = []
    for i, (old, new) in enumerate(edits):
        needle = normalize(old) if fuzzy else old
        occurrences = _count(norm_original, normalize(old))
        if occurrences > 1:
            raise EditError(f"found {occurrences} occurrences of edits[{i}].old_text in {path}, it must be unique")
        matches.append(_Match(i, base.find(needle), len(needle), new))
    matches.sort(key=lambda m: m.start)
    for a, b in zip(matches, matches[1:]):
        if a.start + a.length > b.start:
            raise EditError(f"edits[{a.edit_index}] and edits[{b.edit_index}] overlap in {path}; merge them into "
                            f"one edit or target disjoint regions")
    new_content = _preserving(original, base, matches) if fuzzy else _apply(base, matches)
    if new_content == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return new_content
