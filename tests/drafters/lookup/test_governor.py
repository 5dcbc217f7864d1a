"""The server's prompt-lookup governor, one test per clause of its rule (drafters/lookup/governor.py),
plus the drafter that wires it to the n-gram lookup."""

from __future__ import annotations

from mlxcel.drafters.lookup.governor import (
    FLOOR,
    MIN_ROUNDS,
    SHADOW_RESUME_TOKENS,
    GovernedPromptLookupDrafter,
    LookupGovernor,
)
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.proposal import Proposal

LOW = 1  # accepted drafts of a low-yield round (yield 2 < FLOOR)
HIGH = 7  # yield 8 >= FLOOR


def rounds(g: LookupGovernor, *accepted: int) -> LookupGovernor:
    for a in accepted:
        g.record_round(a)
    return g


def test_floor_constants_are_the_documented_ones():
    assert FLOOR == 4 and MIN_ROUNDS == 2 and SHADOW_RESUME_TOKENS == 7


def test_low_yield_pauses_only_after_two_drafted_rounds():
    g = rounds(LookupGovernor(), LOW)
    assert not g.paused  # one round is not enough evidence
    rounds(g, LOW)
    assert g.paused and g.pauses == 1


def test_a_latest_round_at_the_floor_repays_startup_debt_instead_of_pausing():
    # EMA starts at 0: after LOW, LOW... a round of exactly the floor keeps the row verifying
    g = rounds(LookupGovernor(), LOW, FLOOR - 1)  # yields 2 then 4: EMA 1.0 -> 2.5 < 4
    assert g.ema < FLOOR and not g.paused
    rounds(g, FLOOR - 1, FLOOR - 1, FLOOR - 1)  # latest always at the floor: never paused
    assert not g.paused
    # the same EMA with a latest round under the floor pauses
    g2 = rounds(LookupGovernor(), LOW, FLOOR - 2)
    assert g2.paused


def test_an_isolated_zero_accept_round_after_a_good_ema_gets_one_round_of_grace():
    g = rounds(LookupGovernor(), HIGH, HIGH)  # EMA 4 -> 6
    assert g.ema >= FLOOR
    rounds(g, 0)  # EMA 6 -> 3.5 < floor, latest below floor: grace instead of a pause
    assert g.ema < FLOOR and not g.paused and g.graces == 1


def test_partial_low_yield_acceptance_gets_no_grace():
    g = rounds(LookupGovernor(), HIGH, HIGH)  # EMA 6.0
    rounds(g, 1)  # yield 2: EMA 4.0 ... still at the floor: no pause needed
    assert not g.paused
    g = rounds(LookupGovernor(), HIGH, FLOOR)  # EMA 4 -> 4.5
    rounds(g, 1)  # partial low-yield: EMA 3.25 < floor, no grace -> paused
    assert g.paused and g.graces == 0
    g = rounds(LookupGovernor(), HIGH, FLOOR)
    rounds(g, 0)  # the zero-accept round at the same point is graced
    assert not g.paused and g.graces == 1


def test_grace_never_covers_a_second_consecutive_low_yield_round():
    g = rounds(LookupGovernor(), HIGH, HIGH, 0)
    assert not g.paused  # graced
    rounds(g, 0)  # second low-yield round in a row, EMA below the floor: paused
    assert g.paused and g.graces == 1


def test_pausing_still_needs_the_ema_below_the_floor():
    g = rounds(LookupGovernor(), HIGH, HIGH, HIGH, HIGH, HIGH)  # EMA ~7.75
    rounds(g, 0)  # graced (EMA 4.4 >= floor anyway)
    rounds(g, 0)  # low again, no grace, but EMA 2.7 < floor -> paused
    assert g.paused
    g = rounds(LookupGovernor(), *[HIGH] * 8, 0)
    g.ema = 10.0  # a high EMA: a low round that leaves it at/above the floor does not pause
    g.last_low = True
    rounds(g, 2)  # yield 3 < floor, no grace, EMA 6.5 >= floor
    assert not g.paused


def test_seven_consecutive_shadow_hits_resume_verification_with_a_fresh_start():
    g = rounds(LookupGovernor(), LOW, LOW)
    assert g.paused
    for _ in range(SHADOW_RESUME_TOKENS - 1):
        g.record_shadow(True)
    g.record_shadow(False)  # a miss restarts the count
    assert g.paused and g.streak == 0
    for _ in range(SHADOW_RESUME_TOKENS - 1):
        g.record_shadow(True)
    assert g.paused
    g.record_shadow(True)
    assert not g.paused and g.resumes == 1 and g.ema == 0.0 and g.rounds == 0
    rounds(g, LOW)
    assert not g.paused  # needs two drafted rounds again


def test_adaptive_false_ignores_the_floor():
    g = rounds(LookupGovernor(adaptive=False), 0, 0, 0, 0, LOW, LOW)
    assert not g.paused and g.ema < FLOOR


def _lookup(n_min: int = 0, adaptive: bool = True) -> GovernedPromptLookupDrafter:
    d = GovernedPromptLookupDrafter(1, 3, n_min=n_min, adaptive=adaptive)
    d.start([1], SamplerParams(), 0)
    return d


def test_plain_asks_retracted_proposals_and_gated_out_rows_add_no_evidence():
    d = _lookup(n_min=3)
    seq = [5, 6, 7, 8, 5, 6]  # "5 6" recurs: continuation [7, 8, 5, 6] capped at k
    # retracted: the match is shorter than n_min, nothing is proposed and nothing is recorded
    p = d.propose(seq, 2)
    assert p.tokens == [] and d.retracted == 1
    d.observe([*seq, 7], p, 0)
    # a plain ask: nothing matches
    p = d.propose([1, 2, 3, 4], 4)
    assert p.tokens == []
    d.observe([1, 2, 3, 4, 9], p, 0)
    # gated out: the scheduler asked for no block, so propose is never called
    d.observe([*seq, 7, 8], Proposal([]), 0)
    assert d.governor.rounds == 0 and d.governor.ema == 0.0 and not d.is_paused


def test_paused_rows_observe_emitted_tokens_through_shadow_lookups():
    d = _lookup()
    seq = [1, 2, 3, 4, 1, 2]
    for _ in range(2):  # two verified rounds that accept nothing: paused
        p = d.propose(seq, 3)
        assert p.tokens == [3, 4, 1]
        d.observe([*seq, 9], p, 0)
    assert d.is_paused
    # paused: lookups continue in the shadow, proposals are empty (plain steps)
    s = [1, 2, 3] * 4
    for i in range(SHADOW_RESUME_TOKENS):
        p = d.propose(s, 3)
        assert p.tokens == [] and d.shadow
        s = [*s, d.shadow[0]]  # the target emits what the shadow predicted
        d.observe(s, p, 0)
    assert not d.is_paused and d.counters.resumes == 1
    assert d.counters.shadow_hits == SHADOW_RESUME_TOKENS
    assert d.propose(s, 3).tokens  # verifying again


def test_server_blocks_start_at_block_start_double_while_fully_accepted_and_reset_on_rejection():
    d = GovernedPromptLookupDrafter(1, 3, block_start=2)
    d.start([1], SamplerParams(), 0)
    seq = list(range(40)) + [0]  # "0" recurs: the continuation copies 1, 2, 3, ...
    lengths = []
    for accept_all in (True, True, True, False, True):
        p = d.propose(seq, 32)
        lengths.append(len(p.tokens))
        assert p.tokens == seq[1: 1 + len(p.tokens)]
        accepted = len(p.tokens) if accept_all else 1
        d.observe([*seq, *p.tokens[:accepted], 99], p, accepted)  # the state only counts lengths
    assert lengths == [2, 4, 8, 16, 2]  # doubled after each full block, back to 2 after a partial one
    # the round's k still bounds the block, and the cap never drops below n_min
    fresh = GovernedPromptLookupDrafter(1, 3, block_start=8)
    fresh.start([1], SamplerParams(), 0)
    assert len(fresh.propose(seq, 3).tokens) == 3
    assert GovernedPromptLookupDrafter(1, 3, n_min=5, block_start=2).block_start == 5


def test_block_cap_resets_when_the_row_pauses():
    d = GovernedPromptLookupDrafter(1, 3, block_start=2)
    d.start([1], SamplerParams(), 0)
    seq = list(range(40)) + [0]
    p = d.propose(seq, 32)
    d.observe([*seq, *p.tokens], p, len(p.tokens))  # yield 3: low, but only one round
    assert d.block_cap == 4 and not d.is_paused
    p = d.propose(seq, 32)
    d.observe([*seq, 99], p, 0)  # second low round, EMA under the floor: paused
    assert d.is_paused and d.block_cap == 2
