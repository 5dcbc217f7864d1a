"""``--spec-type ngram-map-k`` and ``ngram-map-k4v``: draft what followed an earlier occurrence of the
sequence's last ``size_n`` tokens (the *key*), with per-key statistics, as upstream's n-gram map does.

* ``ngram-map-k``: the value is the ``size_m`` tokens after the latest earlier occurrence of the key,
  cut to as many tokens as the key's last draft had accepted (a key whose draft was rejected at its
  third token drafts two next time; one rejected at its first drafts nothing again).
* ``ngram-map-k4v``: for every key the distinct ``size_m``-token values seen after its occurrences are
  counted (the first four kept); the most frequent is drafted when the key was looked up at least
  ``min_hits`` times and that value was seen at least twice as often as all the others together, cut
  to that value's own last acceptance. (Upstream's code copies the latest occurrence's continuation
  while naming the most frequent value; this drafts the value it names.)

An occurrence counts only once its whole value and one token more are in the sequence, and the sequence
must hold ``2 * size_n + size_m`` tokens before anything is drafted (upstream's bounds).

What a key learned (how often it was looked up, how many tokens each of its values had accepted) lives
in the slot's :class:`KeyMemory` map and serves the slot's next requests (``slot_source``); where its
occurrences are, and the value counts, describe the current sequence and are rebuilt per request.

A draft shrinks a key's allowance only when the target rejected one of its tokens: a block cut short by
the round's own cap (a shared forward's draft cap, the room left) is no evidence against the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mlxcel.drafters.lookup.options import NgramMapOptions
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

MAX_VALUES = 4  # distinct values counted per key

Key = tuple[int, ...]


@dataclass
class KeyMemory:
    """What one key learned: lookups that found it, and each value's last accepted length."""

    hits: int = 0
    allowance: dict[Key | None, int] = field(default_factory=dict)  # value (None: map-k's) -> tokens


@dataclass
class _Values:
    scanned: int = 0  # occurrences of the key counted so far
    counts: dict[Key, int] = field(default_factory=dict)


class NgramMapKDrafter(Drafter):
    kind = "ngram-map-k"
    deterministic = True
    peeks = True
    counts_values = False  # k4v: draft the most frequent value, not the latest occurrence's

    def __init__(self, options: NgramMapOptions, memory: dict[Key, KeyMemory] | None = None, *, n_min: int = 0):
        self.n, self.m, self.min_hits = options.size_n, options.size_m, options.min_hits
        self.n_min = n_min  # a shorter draft is retracted (--spec-draft-n-min), and teaches the key nothing
        self.memory = {} if memory is None else memory
        self._reset()

    def _reset(self) -> None:
        self.starts: dict[Key, list[int]] = {}  # key -> its occurrences' starts, ascending
        self.indexed = 0  # occurrences starting before this are in ``starts``
        self.values: dict[Key, _Values] = {}
        self._last: tuple[Proposal, Key, Key | None] | None = None

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self._reset()

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        found = self._find(sequence, k, commit=True)
        if found is None:
            self._last = None
            return Proposal([])
        key, value, tokens = found
        proposal = Proposal(tokens if len(tokens) >= self.n_min else [])
        self._last = (proposal, key, value) if proposal.tokens else None
        return proposal

    def peek(self, sequence: Sequence[int]) -> int | None:
        found = self._find(sequence, 1, commit=False)
        return found[2][0] if found is not None and found[2] else None

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        last, self._last = self._last, None
        if last is None or last[0] is not proposal:
            return
        _, key, value = last
        if accepted < len(proposal.tokens):
            self.memory[key].allowance[value] = accepted

    def _find(self, sequence: Sequence[int], k: int, *, commit: bool) -> tuple[Key, Key | None, list[int]] | None:
        """The key, the value drafted (None for map-k) and the tokens, or None when the key has no usable
        occurrence; ``commit``: count the lookup as a hit."""
        n, m = self.n, self.m
        if len(sequence) - 1 < 2 * n + m or k <= 0:
            return None
        self._index(sequence)
        key = tuple(int(t) for t in sequence[-n:])
        starts = self.starts.get(key)
        if not starts:
            return None
        memory = self.memory.setdefault(key, KeyMemory()) if commit else self.memory.get(key, KeyMemory())
        hits = memory.hits + 1
        if commit:
            memory.hits = hits
        if not self.counts_values:
            j = starts[-1]
            size = min(m, memory.allowance.get(None, m), k)
            return key, None, [int(t) for t in sequence[j + n:j + n + size]]
        if hits < self.min_hits:
            return None
        value = self._majority(key, starts, sequence)
        if value is None:
            return None
        return key, value, list(value[:min(m, memory.allowance.get(value, m), k)])

    def _index(self, sequence: Sequence[int]) -> None:
        """Record every occurrence start whose value and one token more are in ``sequence``."""
        n, m = self.n, self.m
        last = len(sequence) - n - m - 2  # the latest start that qualifies
        for j in range(self.indexed, last + 1):
            self.starts.setdefault(tuple(int(t) for t in sequence[j:j + n]), []).append(j)
        self.indexed = max(self.indexed, last + 1)

    def _majority(self, key: Key, starts: list[int], sequence: Sequence[int]) -> Key | None:
        """k4v: the value seen at least twice as often as all others together after ``key``, if any."""
        n, m = self.n, self.m
        stats = self.values.setdefault(key, _Values())
        for j in starts[stats.scanned:]:
            value = tuple(int(t) for t in sequence[j + n:j + n + m])
            if value in stats.counts:
                stats.counts[value] += 1
            elif len(stats.counts) < MAX_VALUES:
                stats.counts[value] = 1
        stats.scanned = len(starts)
        value, count = max(stats.counts.items(), key=lambda item: item[1])
        others = sum(stats.counts.values()) - count
        return value if others == 0 or count >= 2 * others else None


class NgramMapK4vDrafter(NgramMapKDrafter):
    kind = "ngram-map-k4v"
    counts_values = True
