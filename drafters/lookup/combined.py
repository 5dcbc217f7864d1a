"""Several n-gram drafters on one server (``--spec-type ngram-simple,ngram-cache``), combined as upstream
combines its speculative implementations: every round asks them in a fixed order (the registry's, which
is upstream's preference: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache) and the first
that drafts anything serves the round; the others are not asked.

After the round the member that drafted is told how its block fared; the others are told of a plain
step that emitted the round's first token (the sequence as it stood after that token), which is what
they would have seen had they been asked and drafted nothing: a governed prompt lookup's shadow lookup
is scored against the right token, and the drafters that index the sequence catch up on the rest at
their next proposal. Each member drafts at most its own block (its ``--spec-ngram-*`` size); the
combination's block is the largest of them, as upstream's.

Every member is deterministic, so the combination is too, and lossless under every rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel.drafters.source import DrafterSource
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal


class CombinedDrafter(Drafter):
    kind = "combined"
    deterministic = True
    peeks = True

    def __init__(self, members: Sequence[tuple[Drafter, int]]):
        self.members = list(members)  # (drafter, its block), in the order they are asked
        self._served: tuple[int, Proposal] | None = None
        self.served = [0] * len(self.members)  # rounds each member drafted

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self._served = None
        self.served = [0] * len(self.members)
        for drafter, _ in self.members:
            drafter.grammar = self.grammar
            drafter.start(sequence, params, seed)

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        self._served = None
        for i, (drafter, block) in enumerate(self.members):
            proposal = drafter.propose(sequence, min(k, block))
            if proposal.tokens:
                self._served = (i, proposal)
                self.served[i] += 1
                return proposal
        return Proposal([])

    def peek(self, sequence: Sequence[int]) -> int | None:
        for drafter, block in self.members:
            if not drafter.peeks or block <= 0:
                return None  # what it would draft is unknown without asking it
            token = drafter.peek(sequence)
            if token is not None:
                return token
        return None

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        served, self._served = self._served, None
        drafted_by = served[0] if served is not None and served[1] is proposal else None
        first = sequence[:len(sequence) - accepted] if accepted else sequence
        for i, (drafter, _) in enumerate(self.members):
            if i == drafted_by:
                drafter.observe(sequence, proposal, accepted)
            else:
                drafter.observe(first, Proposal([]), 0)

    def counters_line(self) -> str | None:
        lines = [line for drafter, _ in self.members if (line := drafter.counters_line())]
        served = ", ".join(f"{drafter.kind} {n}" for (drafter, _), n in zip(self.members, self.served, strict=True))
        return "\n".join([f"[Combined n-gram drafters] rounds drafted by: {served}", *lines])


class CombinedSource(DrafterSource):
    """The members' sources as one: each sequence gets one drafter of every member, from that member's
    source (with the sequence's slot, so a member keeps its per-slot state)."""

    def __init__(self, sources: Sequence[DrafterSource]):
        self.sources = list(sources)
        block = max((s.declared_block for s in self.sources), default=0)
        super().__init__(lambda n_min, ngram_max: self.new(n_min, ngram_max), block,
                         "combined n-gram drafters, asked in turn: " + "; ".join(s.description for s in self.sources))

    def new(self, n_min: int = 0, ngram_max: int | None = None, slot: int | None = None) -> Drafter:
        return CombinedDrafter([(s.new(n_min, ngram_max, slot=slot), s.declared_block) for s in self.sources])


def combine_sources(sources: Sequence[DrafterSource]) -> DrafterSource:
    """``registry.CombinedKind``'s loader hands the members' sources here."""
    return CombinedSource(sources)
