"""Stop strings, matched on the detokenized text.

A stop string may arrive split over several tokens, so text that ends with a prefix of one is held
back until the next token settles it; only text that can no longer become part of a stop string is
streamed.
"""

from __future__ import annotations


def find_stop(text: str, stops: list[str], search_from: int = 0) -> tuple[int, str] | None:
    """The earliest full occurrence of any stop string starting at or after ``search_from``:
    ``(position, stop)``, or None."""
    best = None
    for stop in stops:
        if not stop:
            continue
        pos = text.find(stop, max(0, search_from))
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def partial_stop_length(text: str, stops: list[str]) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of some stop string
    (how many trailing characters must be held back)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
