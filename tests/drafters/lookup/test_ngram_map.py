"""ngram-map-k and ngram-map-k4v: which occurrence of the key drafts, the per-key allowance learned from
acceptance (and kept across a slot's requests), k4v's majority value and min hits."""

from __future__ import annotations

from mlxcel.drafters.lookup.ngram_map import NgramMapK4vDrafter, NgramMapKDrafter
from mlxcel.drafters.lookup.options import NgramMapOptions
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal

GREEDY = SamplerParams(temperature=0.0)


def started(cls, seq, memory=None, **options):
    drafter = cls(NgramMapOptions(**options), memory)
    drafter.start(seq, GREEDY, 0)
    return drafter


def test_map_k_drafts_what_followed_the_latest_earlier_occurrence_of_the_key():
    #      key (1, 2) at 0 and at 5; the sequence ends with it again
    seq = [1, 2, 3, 4, 5, 1, 2, 7, 8, 9, 6, 6, 6, 1, 2]
    drafter = started(NgramMapKDrafter, seq, size_n=2, size_m=3)
    assert drafter.propose(seq, 8).tokens == [7, 8, 9]  # the latest occurrence (5), its whole value
    assert drafter.propose(seq, 2).tokens == [7, 8]  # the round's block cuts it
    assert drafter.peek(seq) == 7


def test_an_occurrence_counts_only_with_its_value_and_one_token_more_and_short_sequences_draft_nothing():
    seq = [1, 2, 3, 4, 9, 0, 1, 2, 7, 1, 2]  # the occurrence at 6 lacks room for value + 1: the one at 0 drafts
    assert started(NgramMapKDrafter, seq, size_n=2, size_m=2).propose(seq, 8).tokens == [3, 4]
    short = [1, 2, 3, 1, 2]  # fewer than 2n + m + 1 tokens
    assert started(NgramMapKDrafter, short, size_n=2, size_m=1).propose(short, 8).tokens == []


def test_map_k_drafts_no_more_than_the_key_last_had_accepted_and_remembers_it_across_requests():
    seq = [1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 1, 2]
    memory: dict = {}
    drafter = started(NgramMapKDrafter, seq, memory, size_n=2, size_m=4)
    first = drafter.propose(seq, 8)
    assert first.tokens == [3, 4, 5, 6]
    drafter.observe([*seq, 3, 9], first, 1)  # the second draft was rejected
    assert drafter.propose(seq, 8).tokens == [3]
    # a block accepted whole is no evidence against the key: the allowance stays
    full = drafter.propose(seq, 8)
    drafter.observe([*seq, 3, 4], full, 1)
    assert drafter.propose(seq, 8).tokens == [3]
    # the slot's next request (a new drafter on the same memory) starts from what the key learned
    again = started(NgramMapKDrafter, seq, memory, size_n=2, size_m=4)
    assert again.propose(seq, 8).tokens == [3]
    assert started(NgramMapKDrafter, seq, {}, size_n=2, size_m=4).propose(seq, 8).tokens == [3, 4, 5, 6]
    # a key rejected at its first draft drafts nothing again, as upstream's
    rejected = again.propose(seq, 8)
    again.observe([*seq, 9], rejected, 0)
    assert again.propose(seq, 8).tokens == [] and again.peek(seq) is None


def test_map_k4v_drafts_the_majority_value_not_the_latest():
    # key (1, 2) is followed by (5, 5) twice and by (7, 7) once, the latest being (7, 7)
    seq = [1, 2, 5, 5, 0, 1, 2, 5, 5, 0, 1, 2, 7, 7, 0, 3, 3, 1, 2]
    drafter = started(NgramMapK4vDrafter, seq, size_n=2, size_m=2)
    assert drafter.propose(seq, 8).tokens == [5, 5]
    assert started(NgramMapKDrafter, seq, size_n=2, size_m=2).propose(seq, 8).tokens == [7, 7]


def test_map_k4v_needs_a_clear_majority():
    # (5, 5) once and (7, 7) once: neither is seen twice as often as the other
    seq = [1, 2, 5, 5, 0, 1, 2, 7, 7, 0, 3, 3, 1, 2]
    assert started(NgramMapK4vDrafter, seq, size_n=2, size_m=2).propose(seq, 8).tokens == []


def test_map_k4v_drafts_once_the_key_was_looked_up_min_hits_times_and_peek_counts_no_hit():
    seq = [1, 2, 5, 5, 0, 3, 3, 3, 1, 2]
    memory: dict = {}
    drafter = started(NgramMapK4vDrafter, seq, memory, size_n=2, size_m=2, min_hits=3)
    assert drafter.peek(seq) is None and drafter.peek(seq) is None  # peeks are no lookups
    assert drafter.propose(seq, 8).tokens == []  # hit 1
    assert drafter.propose(seq, 8).tokens == []  # hit 2
    assert drafter.peek(seq) == 5
    assert drafter.propose(seq, 8).tokens == [5, 5]  # hit 3
    drafter.observe([*seq, 9], Proposal([5, 5]), 0)  # another proposal object: not this drafter's, ignored
    assert drafter.propose(seq, 8).tokens == [5, 5]


def test_a_draft_shorter_than_n_min_is_retracted_and_teaches_the_key_nothing():
    seq = [1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 1, 2]
    memory: dict = {}
    short = NgramMapKDrafter(NgramMapOptions(size_n=2, size_m=4), memory, n_min=5)
    short.start(seq, GREEDY, 0)
    retracted = short.propose(seq, 8)
    assert retracted.tokens == []
    short.observe([*seq, 9], retracted, 0)
    assert started(NgramMapKDrafter, seq, memory, size_n=2, size_m=4).propose(seq, 8).tokens == [3, 4, 5, 6]
