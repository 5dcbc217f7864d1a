"""``--spec-type ngram-cache``: draft token by token from n-gram statistics, as upstream's n-gram cache
does, with the statistics kept per server slot across its requests.

Three caches (``ngram_counts``): the *context* cache counts every 1..4-gram of every sequence the slot
has run and what followed it, so a span an earlier request read or generated (the same answer asked
again, a tool result pasted back, last turn's reply quoted in this turn's prompt) is drafted the second
time; the *dynamic* cache (``-lcd``) and the *static* cache (``-lcs``) are read from files at load and
shared by every slot, never written (upstream's server does not write them either). Each drafted token
extends the suffix the next one is looked up with, up to the block (8, as upstream).

A slot's new request shares a prefix with what the slot counted last (the same system prompt, the
conversation so far); only the tokens after that common prefix are counted again, so a chat turn does
not count its whole history once more. (Upstream counts only what goes past the previous request's
length, which skips a shorter request's tokens, and only the n-grams inside each round's new tokens,
which drops those that span two rounds; here every n-gram ending at a new token is counted: the intent,
the slot's statistics growing with what it sees, is what is kept.) A slot's context cache is dropped once it holds :data:`MAX_NGRAMS` n-grams, to
keep a long-lived slot's memory bounded; it then counts afresh from the current sequence.

Deterministic proposals; every rule verifies them, so the output is the target's whatever is drafted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mlxcel.drafters.lookup.ngram_counts import LAX, STRICT, NgramCounts, pick, pick_static
from mlxcel.drafters.lookup.options import CACHE_BLOCK, CACHE_NGRAM_MAX, CACHE_NGRAM_MIN, STATIC_NGRAM
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

MAX_NGRAMS = 1 << 18  # a slot's context cache is dropped past this many n-grams (about 100 MB)


@dataclass
class SlotCounts:
    """What one slot keeps across its requests: the context cache, and the tokens it has counted."""

    counts: NgramCounts = field(default_factory=NgramCounts)
    seen: list[int] = field(default_factory=list)  # the last sequence counted, as far as it was counted


@dataclass
class SharedCaches:
    """The file-backed caches every slot reads (empty without ``-lcd`` / ``-lcs``)."""

    dynamic: NgramCounts = field(default_factory=NgramCounts)
    static: NgramCounts = field(default_factory=NgramCounts)


class NgramCacheDrafter(Drafter):
    kind = "ngram-cache"
    deterministic = True
    peeks = True

    def __init__(self, slot: SlotCounts, shared: SharedCaches, block: int = CACHE_BLOCK, *, n_min: int = 0):
        self.slot = slot
        self.shared = shared
        self.block = max(0, block)
        self.n_min = n_min  # a shorter draft is retracted (--spec-draft-n-min)
        self.drafted_rounds = 0  # proposals that drafted something (for tests and the report)

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        seen = self.slot.seen
        keep = 0
        limit = min(len(seen), len(sequence))
        while keep < limit and seen[keep] == sequence[keep]:
            keep += 1
        del seen[keep:]
        self.drafted_rounds = 0
        self._sync(sequence)

    def _sync(self, sequence: Sequence[int]) -> None:
        """Count the tokens of ``sequence`` past what the slot has counted (a sequence only grows
        within a request)."""
        slot = self.slot
        done = len(slot.seen)
        if len(sequence) <= done:
            return
        slot.counts.add(sequence, done, CACHE_NGRAM_MIN, CACHE_NGRAM_MAX)
        slot.seen.extend(int(t) for t in sequence[done:])
        if len(slot.counts) > MAX_NGRAMS:
            slot.counts.clear()
            slot.counts.add(sequence, 0, CACHE_NGRAM_MIN, CACHE_NGRAM_MAX)

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        self._sync(sequence)
        drafts = self._draft(sequence, min(k, self.block))
        if len(drafts) < self.n_min:
            drafts = []
        self.drafted_rounds += bool(drafts)
        return Proposal(drafts)

    def peek(self, sequence: Sequence[int]) -> int | None:
        self._sync(sequence)  # what propose would count first: the same answers after
        drafts = self._draft(sequence, 1)
        return drafts[0] if drafts else None

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        pass  # the emitted tokens are counted when the next proposal reads the sequence

    def _draft(self, sequence: Sequence[int], k: int) -> list[int]:
        if len(sequence) < STATIC_NGRAM or k <= 0:
            return []
        tail = [int(t) for t in sequence[-CACHE_NGRAM_MAX:]]
        context, dynamic, static = self.slot.counts, self.shared.dynamic, self.shared.static
        drafts: list[int] = []
        while len(drafts) < k:
            static_part = static.get(tuple(tail[-STATIC_NGRAM:])) or {}
            longest = min(CACHE_NGRAM_MAX, len(tail))
            suffixes = [tuple(tail[-n:]) for n in range(longest, CACHE_NGRAM_MIN - 1, -1)]
            token = pick(context, suffixes, static_part, LAX)
            if token is None:
                token = pick(dynamic, suffixes, static_part, STRICT)
            if token is None:
                token = pick_static(static_part)
            if token is None:
                break
            drafts.append(token)
            tail.append(token)
        return drafts
