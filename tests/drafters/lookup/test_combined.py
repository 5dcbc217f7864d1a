"""Several n-gram types on one server: the flags make one combined kind whose members are asked in
upstream's order whatever order the flags gave; the first member that drafts serves the round, within its
own block; the others are told of the round's first token; a member's per-slot state still reaches it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mlxcel.drafters.lookup.combined import CombinedDrafter
from mlxcel.drafters.registry import (
    NGRAM_CACHE,
    NGRAM_MOD,
    PROMPT_LOOKUP,
    CombinedKind,
    DrafterChoiceError,
    LookupOptions,
    choose,
    upstream_type,
)
from mlxcel.drafters.source import SourceRequest
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

GREEDY = SamplerParams(temperature=0.0)


def test_n_gram_types_given_together_make_one_kind_asked_in_upstream_order():
    choice = choose(spec_types=["ngram-cache", "ngram-mod", "ngram-simple"])
    kind = choice.kind
    assert isinstance(kind, CombinedKind)
    assert kind.members == (PROMPT_LOOKUP, NGRAM_MOD, NGRAM_CACHE)  # upstream's preference, not the flag's order
    assert kind.spec_types == ("ngram-cache", "ngram-mod", "ngram-simple")  # as given, for speculative.types
    assert upstream_type(kind) == "ngram-cache,ngram-mod,ngram-simple"
    assert kind.loop == "prompt-lookup+ngram-mod+ngram-cache"  # what timings report as draft_kind
    assert not kind.greedy_only and not kind.model_based
    same = choose(spec_types=["ngram-cache"], draft_kind="prompt-lookup").kind
    assert same.members == (PROMPT_LOOKUP, NGRAM_CACHE) and same.spec_types == ("ngram-cache", "ngram-simple")
    assert choose(spec_types=["ngram-cache", "ngram-cache"]).kind is NGRAM_CACHE


@pytest.mark.parametrize("kwargs, needle", [
    ({"spec_types": ["ngram-cache", "draft-simple"], "draft_model": "x.gguf"}, "only the n-gram types combine"),
    ({"spec_types": ["ngram-cache", "ngram-simple"], "draft_model": "x.gguf"}, "needs no draft model"),
    ({"spec_types": ["ngram-map-k"], "draft_model": "x.gguf"}, "ngram-map-k needs no draft model"),
])
def test_what_cannot_combine_is_refused(kwargs, needle):
    with pytest.raises(DrafterChoiceError, match=needle):
        choose(**kwargs)


class Scripted(Drafter):
    """Drafts a fixed block (or nothing) and records what it is asked and told."""

    deterministic = True
    peeks = True

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.asked: list[int] = []
        self.told: list[tuple[list[int], list[int], int]] = []

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        pass

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        self.asked.append(k)
        return Proposal(self.tokens[:k])

    def peek(self, sequence: Sequence[int]) -> int | None:
        return self.tokens[0] if self.tokens else None

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        self.told.append((list(sequence), list(proposal.tokens), accepted))


def test_the_first_member_that_drafts_serves_within_its_block_and_the_rest_see_the_first_token():
    none, second, third = Scripted([]), Scripted([7, 8, 9, 10, 11]), Scripted([5])
    d = CombinedDrafter([(none, 32), (second, 3), (third, 8)])
    d.start([1, 2], GREEDY, 0)
    seq = [1, 2]
    proposal = d.propose(seq, 16)
    assert proposal.tokens == [7, 8, 9] and none.asked == [16] and second.asked == [3] and third.asked == []
    assert d.peek(seq) == 7
    d.observe([*seq, 7, 8, 4], proposal, 2)  # two drafts accepted, then the target's own 4
    assert second.told == [([1, 2, 7, 8, 4], [7, 8, 9], 2)]
    assert none.told == third.told == [([1, 2, 7], [], 0)]  # as after a plain step that emitted 7
    assert d.served == [0, 1, 0]
    # a round nobody drafts is a plain step for every member
    quiet = CombinedDrafter([(Scripted([]), 8), (Scripted([]), 8)])
    assert quiet.propose(seq, 8).tokens == [] and quiet.peek(seq) is None


def test_loaded_members_keep_their_slot_state_and_prompt_lookup_serves_first():
    kind = choose(spec_types=["ngram-cache", "ngram-simple"]).kind
    source = kind.loader()(SourceRequest(kind.drafter_class(), None, lookup=LookupOptions(governed=True)))
    assert source.declared_block == PROMPT_LOOKUP.default_block  # the largest member block (cache: 8)
    answer = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
    first = source.new(slot=0)
    first.start([1, 2, 3], GREEDY, 0)
    first.propose([1, 2, 3, *answer], 16)  # the slot's cache counts what the first request generated
    again = source.new(slot=0)
    again.start([1, 2, 3], GREEDY, 0)
    proposal = again.propose([1, 2, 3], 16)
    assert proposal.tokens == answer[:8]  # prompt lookup finds nothing in [1, 2, 3]; the cache, its block
    assert again.served == [0, 1]
    other = source.new(slot=1)
    other.start([1, 2, 3], GREEDY, 0)
    assert other.propose([1, 2, 3], 16).tokens == []
    repeat = [5, 6, 7, 5, 6]
    fresh = source.new(slot=0)  # a repeat in the sequence itself: prompt lookup, asked first, serves it
    fresh.start(repeat, GREEDY, 0)
    assert fresh.propose(repeat, 16).tokens == [7, 5, 6] and fresh.served == [1, 0]
