"""N-gram statistics: for every n-gram seen, how often each token followed it, and the rule that turns
them into one drafted token (what ``ngram-cache`` chains, ``ngram_cache``).

The rule is upstream's (llama.cpp ``common/ngram-cache``): look at the longest suffix first; a token is
drafted when its n-gram was followed often enough (a sample-size floor per n) and by this token often
enough (a share floor per n). The context cache (the slot's own tokens) is read with the lax floors,
the dynamic cache (earlier generations, ``-lcd``) with the strict ones; the static cache (a corpus's
2-gram statistics, ``-lcs``) weighs the candidates of both (a token it has seen after the last two
tokens counts a hundred times its static count, one it has not counts once) and, when neither
drafts, may draft alone under the lax 2-gram floors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Ngram = tuple[int, ...]


@dataclass(frozen=True)
class Floors:
    """Per n-gram length (index n - 1): the fewest observations, and the smallest share in percent of
    them the drafted token must have."""

    samples: tuple[int, ...]
    percent: tuple[int, ...]


LAX = Floors((2, 2, 1, 1), (66, 50, 50, 50))
STRICT = Floors((4, 3, 2, 2), (75, 66, 66, 66))


class NgramCounts:
    """n-gram -> {token: times it followed that n-gram}."""

    def __init__(self, table: dict[Ngram, dict[int, int]] | None = None):
        self.table: dict[Ngram, dict[int, int]] = {} if table is None else table

    def __len__(self) -> int:
        return len(self.table)

    def clear(self) -> None:
        self.table.clear()

    def get(self, ngram: Ngram) -> dict[int, int] | None:
        return self.table.get(ngram)

    def add(self, tokens: Sequence[int], start: int, ngram_min: int, ngram_max: int) -> None:
        """Count, for every token at index ``start`` or later, the n-grams (``ngram_min``..``ngram_max``
        tokens) that end right before it."""
        table = self.table
        for i in range(max(start, ngram_min), len(tokens)):
            token = int(tokens[i])
            for n in range(ngram_min, min(ngram_max, i) + 1):
                part = table.setdefault(tuple(tokens[i - n:i]), {})
                part[token] = part.get(token, 0) + 1

    def merge(self, other: NgramCounts) -> None:
        for ngram, part in other.table.items():
            mine = self.table.setdefault(ngram, {})
            for token, count in part.items():
                mine[token] = mine.get(token, 0) + count


def pick(counts: NgramCounts, suffixes: Sequence[Ngram], static: dict[int, int], floors: Floors) -> int | None:
    """The token ``counts`` drafts after the sequence whose suffixes (longest first) are ``suffixes``, with
    the static cache's part for the last two tokens (``static``, maybe empty) weighing the candidates."""
    for ngram in suffixes:
        part = counts.get(ngram)
        if not part:
            continue
        best, best_count, best_weight, total = None, 0, 0, 0
        for token, count in part.items():
            weight = 100 * static[token] if token in static else 1
            if count * weight > best_count * best_weight:
                best, best_count, best_weight = token, count, weight
            total += count
        n = len(ngram)
        if total >= floors.samples[n - 1] and 100 * best_count >= floors.percent[n - 1] * total:
            return best
    return None


def pick_static(static: dict[int, int] | None) -> int | None:
    """The token the static cache drafts alone: its most frequent after the last two tokens, under the lax
    2-gram floors."""
    if not static:
        return None
    token, count = max(static.items(), key=lambda item: item[1])
    total = sum(static.values())
    if total < LAX.samples[1] or 100 * count < LAX.percent[1] * total:
        return None
    return token
