"""``--spec-type ngram-mod``: one hashed table, shared by the whole server, from every ``n_match``-token
n-gram any sequence has shown to the token that followed it; a draft chains lookups from the sequence's
last ``n_match`` tokens, each drafted token sliding the window on, as upstream's ngram-mod does.

The table has a fixed number of entries (4 Mi, 16 MB) indexed by the n-gram's hash modulo its size: a
newer n-gram overwrites an older one that hashes alike, and a lookup does not check the n-gram it finds
(a wrong draft costs a rejection, never a wrong token). It is emptied when a request starts with it a
quarter full, and when one sequence's drafts have had under a quarter of their tokens accepted five
rounds in a row (both upstream's rules; the second empties it for every slot, as upstream's does).

A chain that breaks before ``n_min`` tokens drafts nothing; one that holds runs to ``n_max``, then the
round's block cuts it. New n-grams are added in chunks of 32 tokens as the sequence grows, and all of a
request's prompt at its start.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.drafters.lookup.options import NgramModOptions
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

TABLE_SIZE = 4 * 1024 * 1024
EMPTY = -1
RESET_FILL = 0.25  # a request starting with the table fuller than this empties it
ADD_CHUNK = 32  # new n-grams are added once this many tokens have come
LOW_SHARE = 0.25  # a round accepting less than this share of its drafts is a low one
LOW_STREAK = 5  # this many low rounds in a row empty the table


class ModTable:
    """n-gram (by hash) -> the token that last followed an n-gram with that hash."""

    def __init__(self, n: int, size: int = TABLE_SIZE):
        self.n = n
        self.size = size
        self.entries = array("i", [EMPTY]) * size
        self.used = 0

    def _slot(self, ngram: tuple[int, ...]) -> int:
        return hash(ngram) % self.size

    def add(self, ngram: tuple[int, ...], token: int) -> None:
        i = self._slot(ngram)
        if self.entries[i] == EMPTY:
            self.used += 1
        self.entries[i] = token

    def get(self, ngram: tuple[int, ...]) -> int:
        return self.entries[self._slot(ngram)]

    @property
    def fill(self) -> float:
        return self.used / self.size

    def reset(self) -> None:
        self.entries = array("i", [EMPTY]) * self.size
        self.used = 0


@dataclass
class SlotStreak:
    """What a slot keeps across its requests: its run of low-acceptance rounds."""

    low: int = 0


class NgramModDrafter(Drafter):
    kind = "ngram-mod"
    deterministic = True
    peeks = True

    def __init__(self, table: ModTable, options: NgramModOptions, streak: SlotStreak | None = None, *,
                 block_min: int = 0):
        self.table = table
        self.n_max, self.n_min = options.n_max, options.n_min
        self.streak = SlotStreak() if streak is None else streak
        self.block_min = block_min  # a draft cut shorter than this by the round's block is retracted
        self.added = 0  # n-grams starting before this index are in the table
        self._last: Proposal | None = None
        self.resets = 0  # low-acceptance resets this sequence caused

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self.added = 0
        self._last = None
        if len(sequence) < self.table.n:
            return
        self._add(sequence)
        if self.table.fill > RESET_FILL:
            self.table.reset()

    def _add(self, sequence: Sequence[int]) -> None:
        n, table = self.table.n, self.table
        end = len(sequence) - n  # the last n-gram with a token after it starts before this
        for i in range(self.added, end):
            table.add(tuple(int(t) for t in sequence[i:i + n]), int(sequence[i + n]))
        self.added = max(self.added, end)

    def _chain(self, sequence: Sequence[int]) -> list[int]:
        n = self.table.n
        if len(sequence) < n:
            return []
        if self.added + ADD_CHUNK < len(sequence):
            self._add(sequence)
        window = [int(t) for t in sequence[-n:]]
        for i in range(self.n_max):
            token = self.table.get(tuple(window[i:i + n]))
            if token == EMPTY:
                if i < self.n_min:
                    return []
                break
            window.append(token)
        return window[n:]

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        drafts = self._chain(sequence)[:max(0, k)]
        if len(drafts) < self.block_min:
            drafts = []
        proposal = Proposal(drafts)
        self._last = proposal if drafts else None
        return proposal

    def peek(self, sequence: Sequence[int]) -> int | None:
        drafts = self._chain(sequence)  # adds what propose would add first: the same answers after
        return drafts[0] if drafts else None

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        last, self._last = self._last, None
        if last is None or last is not proposal:
            return
        if accepted / len(proposal.tokens) >= LOW_SHARE:
            self.streak.low = 0
            return
        self.streak.low += 1
        if self.streak.low >= LOW_STREAK:
            self.table.reset()
            self.streak.low = 0
            self.added = 0
            self.resets += 1
