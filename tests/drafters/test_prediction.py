"""A request's predicted output as a draft source (``drafters.prediction``): the walk of the output
against the prediction (following, an edit, resynchronising, a spurious match that must not carry the
walk past where the output comes back), OpenAI's accepted / rejected counts, the drafter's blocks and
peeks, the prediction ahead of a server's own drafter, the rules its traits select, and, on a real tiny
checkpoint, output identical to plain decoding at temperature 0 and under a seed whatever the prediction."""

from __future__ import annotations

import pytest
from target_only import speculative_tokens, target_only_tokens

from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
from mlxcel.drafters.prediction import (
    BLOCK_START,
    PredictionAlignment,
    PredictionDrafter,
    PredictionFirst,
    prediction_counts,
)
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import GREEDY_ARGMAX, SAMPLER_MATCH, STOCHASTIC, select_rule

NL, IND = 1, 2  # a newline and an indent: the tokens every line of code shares
GREEDY = SamplerParams(temperature=0.0, ignore_eos=True, seed=0)
PROMPT_TEXT = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"


def prompt_tokens(model) -> list[int]:
    return list(model.tokenizer.encode(PROMPT_TEXT))


def walked(prediction, output) -> PredictionAlignment:
    walk = PredictionAlignment(prediction)
    walk.feed(output)
    return walk


# -- the walk ---------------------------------------------------------------------------------------


def test_an_output_that_follows_the_prediction_is_offered_its_next_tokens():
    walk = walked(range(10, 30), [10, 11, 12])
    assert walk.upcoming(4) == [13, 14, 15, 16]
    assert walk.accepted == 3
    assert walked(range(10, 30), []).upcoming(2) == [10, 11]  # before the first token: the prediction's start


def test_after_a_replaced_token_the_walk_resynchronises_on_two_agreeing_tokens():
    before, after = [20, 21, 22, 23], [30, 31, 32, 33, 34, 35]
    walk = walked([*before, 40, *after], [*before, 99, 30])
    assert walk.upcoming(3) == []  # one token agreeing again is not enough to trust
    walk.feed([31])
    assert walk.upcoming(3) == [32, 33, 34]
    walk.feed(after[2:])
    assert prediction_counts([*before, 40, *after], walk.output) == (len(before) + len(after), 1)


def test_an_output_that_comes_back_to_the_token_it_left_at_is_followed_at_once():
    """A reply that opens with a fence before the file: its first file token is the prediction's first."""
    walk = walked([20, 21, 22, 23], [7, 8, 9, 20])
    assert walk.upcoming(2) == [21, 22]
    assert walked([20, 21, 22, 23], [7, 8, 9, 21]).upcoming(2) == []  # one token elsewhere is not enough


def test_a_deletion_and_an_insertion_are_found_again():
    a, b, c = [20, 21, 22, 23], [40, 41, 42, 43], [30, 31, 32, 33]
    deleted = walked([*a, *b, *c], [*a, 30, 31])
    assert deleted.upcoming(2) == [32, 33]
    inserted = walked([*a, *c], [*a, 50, 51, 52, 30, 31])
    assert inserted.upcoming(2) == [32, 33]
    counts = prediction_counts([*a, *b, *c], [*a, *c])
    assert (counts.accepted, counts.rejected) == (8, 4)


def test_a_spurious_match_ahead_does_not_carry_the_walk_past_the_line_the_output_returns_to():
    """A line inserted before line 1: its last tokens ("\\n" + indent) also end line 1 and start line 2,
    so the walk first jumps to line 2 (tentatively); the output then writes line 1, which is behind the
    jump but ahead of the last confirmed point, and the walk must find it there."""
    line1, line2, line3 = [IND, 7, 8, NL], [IND, 9, 10, NL], [IND, 11, 12, NL]
    prediction = [5, NL, *line1, *line2, *line3]
    output = [5, NL, IND, 50, 51, NL, IND, 7]  # the inserted line "IND 50 51 NL", then line 1 begins
    walk = walked(prediction, output)
    assert walk.upcoming(3) == [8, NL, IND]
    walk.feed([8, NL, *line2, *line3])
    counts = prediction_counts(prediction, walk.output)
    assert (counts.accepted, counts.rejected) == (len(prediction), 0)


def test_counts_are_openais_on_known_cases():
    assert prediction_counts([1, 2, 3], [7, 8, 9, 10]) == (0, 3)  # nothing of it appeared
    assert prediction_counts([1, 2, 3], [1, 2, 3]) == (3, 0)
    assert prediction_counts([1, 2, 3, 4, 5, 6], [1, 2, 3]) == (3, 3)  # the completion stopped half way
    assert prediction_counts([1, 2, 3], [1, 2, 3, 1, 2, 3]) == (3, 0)  # a prediction token pairs at most once
    assert prediction_counts([], [1, 2]) == (0, 0)
    # a resynchronisation the completion ended on counts: the tokens appeared
    assert prediction_counts([1, 2, 3, 4, 5], [1, 9, 3, 4]) == (3, 2)


# -- the drafter ------------------------------------------------------------------------------------


def test_the_drafter_skips_the_prompt_grows_its_block_and_peeks_what_it_proposes():
    prediction = list(range(100, 200))
    prompt = [100, 101, 102, 5]  # prompt tokens are not the output: they never align
    d = PredictionDrafter(prediction)
    d.start([*prompt, 100], GREEDY, 0)
    seq = [*prompt, 100]
    assert d.peek(seq) == 101
    first = d.propose(seq, 64)
    assert first.tokens == prediction[1:1 + BLOCK_START]
    seq += first.tokens + [prediction[1 + BLOCK_START]]
    d.observe(seq, first, len(first.tokens))
    second = d.propose(seq, 64)
    assert len(second.tokens) == 2 * BLOCK_START and second.tokens[0] == seq[-1] + 1
    seq += second.tokens[:3] + [7]  # three accepted, then the target wrote something else
    d.observe(seq, second, 3)
    assert d.propose(seq, 64).tokens == []  # departed
    assert d.walk.accepted == 1 + BLOCK_START + 1 + 3
    assert d.block_cap == BLOCK_START


def test_a_block_shorter_than_n_min_is_not_proposed():
    d = PredictionDrafter([50, 51, 52, 53], n_min=4)
    d.start([1, 50], GREEDY, 0)
    assert d.propose([1, 50], 8).tokens == [] and d.peek([1, 50]) is None  # three left: fewer than four
    d = PredictionDrafter([50, 51, 52, 53, 54], n_min=4)
    d.start([1, 50], GREEDY, 0)
    assert d.peek([1, 50]) == 51 and d.propose([1, 50], 8).tokens == [51, 52, 53, 54]


def test_ahead_of_a_servers_drafter_the_prediction_serves_first_and_the_other_drafts_when_it_cannot():
    prompt = [40, 41, 42, 43, 40, 41]
    prediction = [50, 51, 52, 53, 54, 55]
    both = PredictionFirst(PredictionDrafter(prediction), PromptLookupDrafter(1, 3), 4, vocab_size=64)
    assert both.deterministic and both.peeks and not both.provides_distribution
    seq = [*prompt, 50]
    both.start(seq, GREEDY, 0)
    p = both.propose(seq, 8)
    assert p.tokens == [51, 52, 53, 54, 55] and p.q is None
    seq += [51, 42]  # one accepted; the target's own token departs from the prediction
    both.observe(seq, p, 1)
    assert both.propose(seq, 8).tokens == [43, 40, 41, 50]  # prompt lookup, within its block of 4
    assert both.prediction.counters.proposals == 1


def test_ahead_of_a_draft_model_the_predictions_drafts_carry_point_masses(tiny_llama):
    both = PredictionFirst(PredictionDrafter([5, 6, 7, 8]), DraftModelDrafter(tiny_llama), 3,
                           vocab_size=tiny_llama.vocab_size)
    assert both.provides_distribution and not both.deterministic
    seq = [3, 4, 5]
    both.start(seq, SamplerParams(temperature=0.8), 0)
    p = both.propose(seq, 4)
    assert p.tokens == [6, 7, 8]
    assert p.q.shape == (3, tiny_llama.vocab_size) and p.q.sum().item() == 3.0
    assert [int(i) for i in p.q.argmax(axis=-1).tolist()] == [6, 7, 8]
    rule = select_rule(SamplerParams(temperature=0.8), has_proposal_distribution=both.provides_distribution,
                       deterministic_proposals=both.deterministic, stochastic=True)
    assert rule == STOCHASTIC  # the draft model's opt-in: modified rejection sampling takes the point masses


@pytest.mark.parametrize("temperature,stochastic,rule", [(0.0, None, GREEDY_ARGMAX), (0.8, None, SAMPLER_MATCH),
                                                         (0.8, True, SAMPLER_MATCH)])
def test_the_traits_select_an_exact_rule(temperature, stochastic, rule):
    d = PredictionDrafter([1])
    assert select_rule(SamplerParams(temperature=temperature), has_proposal_distribution=d.provides_distribution,
                       deterministic_proposals=d.deterministic, argmax_verify=d.argmax_verify,
                       stochastic=stochastic) == rule


# -- exactness on a real checkpoint -------------------------------------------------------------------


def edits(plain: list[int], vocab: int) -> dict[str, list[int]]:
    """Predictions of ``plain``: itself, with a replaced span, an insertion, a deletion, and a wrong one."""
    mid = len(plain) // 2
    other = [(t + 7) % vocab for t in plain]
    return {"exact": plain, "replaced": plain[:mid] + other[mid:mid + 3] + plain[mid + 3:],
            "inserted": plain[:mid] + other[:5] + plain[mid:], "deleted": plain[:mid] + plain[mid + 6:],
            "wrong": other}


@pytest.mark.parametrize("params", [GREEDY, SamplerParams(temperature=0.9, top_k=40, ignore_eos=True, seed=11)],
                         ids=["greedy", "seeded"])
def test_output_equals_plain_decoding_whatever_the_prediction(tiny_llama, params):
    prompt = prompt_tokens(tiny_llama)
    n = 48
    plain = target_only_tokens(tiny_llama, prompt, params, n)
    for name, predicted in edits(plain, tiny_llama.vocab_size).items():
        got, counters = speculative_tokens(tiny_llama, PredictionDrafter(predicted), prompt, params, n, k=16)
        assert got == plain, name
        assert counters.rule == (GREEDY_ARGMAX if params.greedy else SAMPLER_MATCH)
        if name == "exact":
            assert counters.accepted >= n - 1 - counters.rounds  # every round but its own token was drafted
        if name == "wrong":
            assert counters.accepted == 0
        counts = prediction_counts(predicted, got)
        assert counts.accepted + counts.rejected == len(predicted)
        assert counts.accepted == (n if name == "exact" else counts.accepted)


@pytest.mark.parametrize("fallback", ["prompt-lookup", "draft-model"])
def test_the_prediction_ahead_of_a_servers_drafter_is_exact_too(tiny_llama, fallback):
    """The prediction serves the first rounds, then the server's drafter the rest: a draft model, which
    keeps a cache in step with what it is told, must be told of the rounds the prediction served."""
    prompt = prompt_tokens(tiny_llama)
    plain = target_only_tokens(tiny_llama, prompt, GREEDY, 40)
    predicted = plain[:20] + [(t + 3) % tiny_llama.vocab_size for t in plain[20:]]
    other = PromptLookupDrafter(1, 3) if fallback == "prompt-lookup" else DraftModelDrafter(tiny_llama)
    both = PredictionFirst(PredictionDrafter(predicted), other, 3, tiny_llama.vocab_size)
    got, counters = speculative_tokens(tiny_llama, both, prompt, GREEDY, 40, k=16)
    assert got == plain and counters.accepted > 0
    assert both.prediction.counters.accepted > 0
    if fallback == "draft-model":  # the target's own weights: after the prediction ends, it drafts and is right
        assert counters.accepted > both.prediction.counters.accepted
