"""ngram-mod: chained lookups in the shared table, its n_min / n_max, the table shared by every slot,
and its two resets (a request starting with it a quarter full, five low-acceptance rounds in a row)."""

from __future__ import annotations

from mlxcel.drafters.lookup.ngram_mod import LOW_STREAK, ModTable, NgramModDrafter, SlotStreak
from mlxcel.drafters.lookup.options import NgramModOptions
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal

GREEDY = SamplerParams(temperature=0.0)
CYCLE = [10, 11, 12, 13, 14, 15]


def drafter(table, streak=None, block_min=0, **options):
    return NgramModDrafter(table, NgramModOptions(**{"n_match": 2, "n_max": 8, "n_min": 0, **options}), streak,
                           block_min=block_min)


def test_a_chain_of_lookups_drafts_the_repeating_cycle_up_to_n_max_and_the_block():
    seq = CYCLE * 2 + CYCLE[:2]
    d = drafter(ModTable(2, size=4096))
    d.start(seq, GREEDY, 0)
    assert d.propose(seq, 16).tokens == (CYCLE[2:] + CYCLE)[:8]
    assert d.propose(seq, 3).tokens == CYCLE[2:5]
    assert d.peek(seq) == CYCLE[2]


def test_a_chain_that_breaks_before_n_min_drafts_nothing():
    # the request's start adds the one n-gram (8, 9) -> 20; n-grams come in 32 tokens at a time after it,
    # so at the end of this sequence the chain drafts 20, then finds nothing after (9, 20)
    seq = [8, 9, 20, 5, 8, 9]
    for n_min, drafted in ((1, [20]), (2, [])):
        d = drafter(ModTable(2, size=4096), n_min=n_min)
        d.start(seq[:3], GREEDY, 0)
        assert d.propose(seq, 16).tokens == drafted
        assert d.peek(seq) == (drafted[0] if drafted else None)


def test_the_table_is_shared_by_every_slot():
    table = ModTable(2, size=4096)
    first = drafter(table, SlotStreak())
    first.start(CYCLE * 2, GREEDY, 0)
    other = drafter(table, SlotStreak())  # another slot's sequence, which never saw the cycle
    seq = [99, 98, CYCLE[0], CYCLE[1]]
    other.start(seq, GREEDY, 0)
    assert other.propose(seq, 4).tokens == CYCLE[2:6]


def test_five_low_acceptance_rounds_in_a_row_empty_the_table():
    table = ModTable(2, size=4096)
    streak = SlotStreak()
    seq = CYCLE * 2
    d = drafter(table, streak)
    d.start(seq, GREEDY, 0)
    for i in range(LOW_STREAK):
        proposal = d.propose(seq, 8)
        assert len(proposal.tokens) == 8
        d.observe([*seq, 0], proposal, 1)  # 1 of 8: below a quarter
        assert streak.low == (i + 1) % LOW_STREAK
    assert table.used == 0 and d.resets == 1
    assert d.propose(seq, 8).tokens == []
    # a good round in between restarts the count; another proposal's observation counts nothing
    d.start(seq, GREEDY, 0)
    p = d.propose(seq, 8)
    d.observe([*seq, 0], p, 1)
    p = d.propose(seq, 8)
    d.observe([*seq, *p.tokens[:4]], p, 4)
    assert streak.low == 0
    d.observe([*seq, 0], Proposal([1, 2]), 0)
    assert streak.low == 0


def test_a_request_starting_with_the_table_over_a_quarter_full_empties_it():
    table = ModTable(2, size=16)
    d = drafter(table)
    d.start(list(range(20)), GREEDY, 0)  # 18 n-grams into 16 entries
    assert table.used == 0
    d.start([1, 2, 3], GREEDY, 0)  # one n-gram: 1/16 full, kept
    assert table.used == 1


def test_a_chain_cut_shorter_than_n_min_by_the_block_is_retracted():
    seq = CYCLE * 2
    d = drafter(ModTable(2, size=4096), block_min=4)
    d.start(seq, GREEDY, 0)
    assert d.propose(seq, 3).tokens == [] and len(d.propose(seq, 4).tokens) == 4
