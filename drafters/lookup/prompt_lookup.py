"""Prompt lookup: draft by copying what followed the most recent earlier occurrence of the
sequence's last n tokens (n from ``ngram_max`` down to ``ngram_min``), searching the prompt and
everything generated so far. No model, no cache.

Its proposals are deterministic, so ``q`` is a point mass on each drafted token: sampler-match
then accepts with probability ``p(d)``, which is also the coupling ceiling, so no other rule
could do better here.

The CLI-side governor is a two-state machine and has no break-even floor:

* *verifying*: every match is proposed and verified. A verified block that gets nothing
  accepted pauses the drafter.
* *paused*: the drafter still looks up a continuation each step (a *shadow* lookup) but
  proposes nothing, so the step is a plain one-token decode. When shadow lookups have
  correctly predicted two emitted tokens in a row, verification resumes.

A failed block therefore costs one wasted verify width, not one per step, while text that has
started repeating again is picked up after two tokens.

Block growth (shared with the server's drafter): a proposal holds at most ``block_start`` tokens
at first; each block the target accepts in full doubles that cap (the round's ``k`` still bounds
it), and any rejection, pause or resume sets it back. A verbatim copy thus runs in a few wide
rounds, while text that is only partly copied never pays for a wide block it has not earned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

SHADOW_CONFIRM_TOKENS = 2
BLOCK_START = 8  # the first block's cap; it doubles after each fully accepted block


@dataclass
class PromptLookupCounters:
    lookups: int = 0  # lookups while verifying
    matches: int = 0  # lookups that found a continuation
    verified_blocks: int = 0
    accepted_tokens: int = 0
    pauses: int = 0
    shadow_lookups: int = 0
    shadow_hits: int = 0  # emitted tokens a shadow lookup had predicted
    resumes: int = 0


class NgramIndex:
    """For each n, the end (exclusive) of the most recent occurrence of every n-gram, over the
    n-grams that end before the sequence's last position; extended incrementally."""

    def __init__(self, ngram_min: int, ngram_max: int):
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.last_end: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(ngram_min, ngram_max + 1)}
        self.indexed_to = 0  # n-grams with end <= indexed_to are in the index

    def reset(self) -> None:
        for table in self.last_end.values():
            table.clear()
        self.indexed_to = 0

    def continuation(self, sequence: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix
        (between ngram_min and ngram_max tokens) that has one."""
        length = len(sequence)
        self._extend(sequence, length - 1)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            end = self.last_end[n].get(tuple(sequence[length - n :]))
            if end is not None:
                return [int(t) for t in sequence[end : end + k]]
        return []

    def _extend(self, sequence: Sequence[int], upto: int) -> None:
        for end in range(self.indexed_to + 1, upto + 1):
            for n, table in self.last_end.items():
                if end >= n:
                    table[tuple(sequence[end - n : end])] = end
        self.indexed_to = max(self.indexed_to, upto)


class PromptLookupDrafter(Drafter):
    kind = "prompt-lookup"
    deterministic = True
    peeks = True

    def __init__(self, ngram_min: int = 1, ngram_max: int = 3, *, shadow_confirm: int = SHADOW_CONFIRM_TOKENS,
                 block_start: int = BLOCK_START):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"prompt lookup needs 1 <= ngram_min <= ngram_max (got {ngram_min}, {ngram_max})")
        self.index = NgramIndex(ngram_min, ngram_max)
        self.shadow_confirm = shadow_confirm
        self.block_start = max(1, block_start)
        self.block_cap = self.block_start
        self.paused = False
        self.shadow: list[int] = []
        self.streak = 0
        self.counters = PromptLookupCounters()

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self.index.reset()
        self.paused = False
        self.shadow = []
        self.streak = 0
        self.block_cap = self.block_start
        self.counters = PromptLookupCounters()

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        found = self.index.continuation(sequence, min(k, self.block_cap))
        if self.paused:
            self.counters.shadow_lookups += 1
            self.shadow = found
            return Proposal([])
        self.counters.lookups += 1
        if found:
            self.counters.matches += 1
        return Proposal(found)

    def peek(self, sequence: Sequence[int]) -> int | None:
        found = self.index.continuation(sequence, 1)  # extends the index as propose would: same answers after
        return found[0] if found else None

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        emitted = sequence[len(sequence) - accepted - 1 :]
        if proposal.tokens:
            self.counters.verified_blocks += 1
            self.counters.accepted_tokens += accepted
            full = accepted == len(proposal.tokens)
            self.block_cap = self.block_cap * 2 if full else self.block_start
            if accepted == 0:
                self.paused = True
                self.counters.pauses += 1
                self.streak = 0
                self.shadow = []
            return
        if not self.paused:
            return
        if self.shadow and int(emitted[0]) == self.shadow[0]:
            self.streak += 1
            self.counters.shadow_hits += 1
        else:
            self.streak = 0
        self.shadow = []
        if self.streak >= self.shadow_confirm:
            self.paused = False
            self.streak = 0
            self.block_cap = self.block_start
            self.counters.resumes += 1

    def counters_line(self) -> str:
        c = self.counters
        return (
            f"[Prompt lookup] ngram={self.index.ngram_min}..{self.index.ngram_max} lookups={c.lookups} "
            f"matches={c.matches} verified_blocks={c.verified_blocks} accepted={c.accepted_tokens} "
            f"pauses={c.pauses} shadow_lookups={c.shadow_lookups} shadow_hits={c.shadow_hits} "
            f"resumes={c.resumes} (paused after a block with nothing accepted; resumed after "
            f"{self.shadow_confirm} shadow-predicted tokens in a row)"
        )
