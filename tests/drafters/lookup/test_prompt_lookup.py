"""Prompt lookup: the n-gram search and the CLI governor (pause on a failed block, two-token
shadow confirmation to resume, no break-even floor)."""

from __future__ import annotations

import pytest

from mlxcel.drafters.lookup.governor import GovernedPromptLookupDrafter
from mlxcel.drafters.lookup.prompt_lookup import NgramIndex, PromptLookupDrafter
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.session import SpeculativeSession


def lookup(seq, k=4, lo=1, hi=3):
    return NgramIndex(lo, hi).continuation(seq, k)


def test_longest_ngram_wins_and_the_most_recent_occurrence_is_used():
    #        0  1  2  3  4  5  6  7  8  9 10
    seq = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3]
    # suffix (2, 3) last occurred ending at 7 -> continuation starts with 8; the trigram (9?, 2, 3)
    # is (5, 2, 3) which never occurred, so the bigram decides.
    assert lookup(seq) == [8, 5, 2, 3]
    # Longest first: (1, 2, 3) at the end matches only at the start (followed by 9) although the
    # bigram (2, 3) occurred more recently.
    assert lookup([1, 2, 3, 9, 7, 2, 3, 4, 1, 2, 3], hi=3) == [9, 7, 2, 3]
    assert lookup([1, 2, 3, 9, 7, 2, 3, 4, 1, 2, 3], hi=2) == [4, 1, 2, 3]


def test_continuation_is_capped_at_k_and_may_run_into_the_suffix():
    assert lookup([4, 5, 6, 4, 5], k=2) == [6, 4]
    assert lookup([7, 7, 7], k=4) == [7]  # (7, 7) ending at 2 wins; the copy stops at the end
    assert lookup([4, 5, 4, 5, 4], k=4, hi=1) == [5, 4]  # most recent 4 (index 2)


def test_no_match_gives_nothing_and_the_suffix_never_matches_itself():
    assert lookup([1, 2, 3, 4]) == []
    assert lookup([5]) == []


def test_ngram_min_is_respected():
    assert lookup([1, 2, 9, 3, 2], lo=2) == []
    assert lookup([1, 2, 9, 3, 2], lo=1) == [9, 3, 2]


def test_incremental_index_equals_a_fresh_one():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    index = NgramIndex(1, 3)
    for end in range(2, len(seq) + 1):
        assert index.continuation(seq[:end], 3) == NgramIndex(1, 3).continuation(seq[:end], 3)


def test_bad_ngram_range_is_refused():
    with pytest.raises(ValueError):
        PromptLookupDrafter(3, 2)
    with pytest.raises(ValueError):
        PromptLookupDrafter(0, 2)


def test_governor_pauses_after_a_failed_block_and_resumes_after_two_shadow_hits():
    d = PromptLookupDrafter(1, 2)
    seq = [1, 2, 3, 4, 1, 2]
    d.start(seq, SamplerParams(), 0)
    prop = d.propose(seq, 4)
    assert prop.tokens == [3, 4, 1, 2]
    seq = [*seq, 7]  # the target rejected the first draft and emitted 7
    d.observe(seq, prop, 0)
    assert d.paused and d.counters.pauses == 1
    # Paused: lookups still run (shadow) but nothing is proposed.
    seq = [*seq, 1]
    prop = d.propose(seq, 4)  # suffix (7, 1) unseen, (1,) -> ends at 5 -> [2, 7, 1]
    assert prop.tokens == [] and d.shadow == [2, 7, 1]
    seq = [*seq, 2]  # plain step emitted 2: shadow hit 1
    d.observe(seq, Proposal([]), 0)
    assert d.paused and d.streak == 1
    prop = d.propose(seq, 4)
    assert prop.tokens == [] and d.shadow[0] == 7
    seq = [*seq, 5]  # miss: the streak resets
    d.observe(seq, Proposal([]), 0)
    assert d.paused and d.streak == 0
    prop = d.propose(seq, 4)
    assert d.shadow == []  # 5 never occurred before: no shadow prediction
    seq = [*seq, 1]
    d.observe(seq, Proposal([]), 0)
    assert d.paused and d.streak == 0
    # Two hits in a row resume verification.
    for _ in range(2):
        prop = d.propose(seq, 4)
        assert prop.tokens == []
        seq = [*seq, d.shadow[0]]
        d.observe(seq, Proposal([]), 0)
    assert not d.paused and d.counters.resumes == 1
    assert d.propose(seq, 4).tokens  # verifying again
    assert d.counters.shadow_hits == 3


def test_a_partially_accepted_block_keeps_verifying():
    d = PromptLookupDrafter(1, 2)
    seq = [1, 2, 3, 4, 1, 2]
    d.start(seq, SamplerParams(), 0)
    prop = d.propose(seq, 4)
    d.observe([*seq, 3, 9], prop, 1)
    assert not d.paused
    assert d.counters.verified_blocks == 1 and d.counters.accepted_tokens == 1


def test_counters_line_format():
    line = PromptLookupDrafter(2, 4).counters_line()
    assert line.startswith("[Prompt lookup] ngram=2..4 lookups=0 matches=0 verified_blocks=0 accepted=0 "
                           "pauses=0 shadow_lookups=0 shadow_hits=0 resumes=0 (")


def test_peek_is_the_first_draft_and_changes_no_later_answer():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    peeking, plain = PromptLookupDrafter(1, 3), PromptLookupDrafter(1, 3)
    assert PromptLookupDrafter.peeks
    for d in (peeking, plain):
        d.start(seq[:2], SamplerParams(), 0)
    for end in range(2, len(seq) + 1):
        first = peeking.peek(seq[:end])
        proposed = peeking.propose(seq[:end], 3).tokens
        assert proposed == plain.propose(seq[:end], 3).tokens
        assert first == (proposed[0] if proposed else None)
    assert peeking.counters == plain.counters  # a peek is no lookup of the report's


def test_a_capped_session_scores_its_peeks_against_the_emitted_token_and_reports_none():
    session = SpeculativeSession(GovernedPromptLookupDrafter(1, 3), SamplerParams(), n_max=8)
    seq = [5, 6, 7, 8, 5, 6]  # the lookup would draft 7, 8, ...
    session.begin(seq, 0)
    assert session.evidence == (0, 0)
    for emitted, hits in ((7, 1), (1, 1)):  # a hit, then (after 5 6 7 -> 8) a miss
        prep = session.prepare(seq, 100, cap=0)
        assert prep.drafts == [] and prep.block == [seq[-1]]
        result = session.quiet(prep, seq, emitted)
        session.record(result)
        seq = seq + [emitted]
        assert session.evidence == (hits, len(seq) - 6)
    c = session.counters
    assert (c.positions_tested, c.accepted, c.rounds, c.plain_steps) == (0, 0, 0, 2)  # the report: two plain steps
    # no peek when the cap does not stop the row (its drafts are tested instead), nor when the budget does
    session = SpeculativeSession(GovernedPromptLookupDrafter(1, 3), SamplerParams(), n_max=8)
    seq = [1, 2, 3, 1, 2]
    session.begin(seq, 0)
    assert session.prepare(seq, 100, cap=4).drafts == [3, 1, 2]
    session.record(session.quiet(session.prepare(seq, 1, cap=0), seq, 3))
    assert session.evidence == (0, 0)
    # nothing to peek (no match): no evidence either way
    session = SpeculativeSession(GovernedPromptLookupDrafter(1, 3), SamplerParams(), n_max=8)
    session.begin([40, 41], 0)
    session.record(session.quiet(session.prepare([40, 41], 100, cap=0), [40, 41], 42))
    assert session.evidence == (0, 0)
