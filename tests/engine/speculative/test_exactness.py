"""Exactness of speculative decoding on real tiny MLX checkpoints.

* temperature 0: byte-identical to plain greedy decoding, with a draft model and with prompt lookup;
* the target KV cache holds exactly the emitted sequence (minus the pending token) after every
  round, in the all-reject and all-accept regimes, and so does the drafter's
  (offset + owed == target offset) in the all-reject, all-accept and mixed regimes, checked both
  by the counts and by the logits the rewound caches produce;
* a fully accepted round owes its last proposal, and the next round pays it;
* seed invariance: sampler-match at temperature 0.7 and 1.0 emits the same tokens as plain
  decoding under the same seed, with a draft model and with prompt lookup.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from target_only import speculative_tokens, target_only_tokens
from tiny_checkpoints import perturbed_copy

from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.cache.prefill import prefill
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import GREEDY_ARGMAX, SAMPLER_MATCH, select_rule
from mlxcel.engine.speculative.verify import verify_round

pytestmark = pytest.mark.mlx_native  # also run under MLXCEL_KERNELS=mlx (make test)

BANNED = 7  # a token the target is never allowed to emit (logit_bias -inf)
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture(scope="module")
def target(tiny_llama):
    return tiny_llama


@pytest.fixture(scope="module")
def twin(tiny_llama_dir):
    """The target's own weights: at temperature 0 it drafts what the target picks."""
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="module")
def noisy(tiny_llama_dir, tmp_path_factory):
    """A perturbed copy: agrees with the target often, not always."""
    return load_model(perturbed_copy(tiny_llama_dir, tmp_path_factory.mktemp("noisy") / "d", 0.9, seed=5))


class BannedTokenDrafter(DraftModelDrafter):
    """A real draft model whose every draft is a token the target has banned: all-reject."""

    def _draw(self, logits, history, position):
        return BANNED, None


def prompt_of(model) -> list[int]:
    return list(model.tokenizer.encode(PROMPT_TEXT))


GREEDY = SamplerParams(temperature=0.0, ignore_eos=True, seed=0)


# -- temperature 0 -----------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["twin", "noisy", "prompt-lookup"])
def test_temperature_zero_stream_is_byte_identical_to_greedy_target_only(target, twin, noisy, which):
    prompt = prompt_of(target)
    drafter = {"twin": lambda: DraftModelDrafter(twin), "noisy": lambda: DraftModelDrafter(noisy),
               "prompt-lookup": lambda: PromptLookupDrafter(1, 3)}[which]()
    want = target_only_tokens(target, prompt, GREEDY, 48)
    got, counters = speculative_tokens(target, drafter, prompt, GREEDY, 48)
    assert counters.rule == GREEDY_ARGMAX
    assert got == want
    text = target.tokenizer.decode(got)
    assert text == target.tokenizer.decode(want)
    if which == "twin":
        assert counters.accepted == counters.proposed > 0  # the all-accept regime really ran
    if which == "noisy":
        assert 0 < counters.accepted < counters.proposed  # and the mixed one


# -- cache arithmetic, round by round -------------------------------------------------------------

def run_rounds(target, drafter, params, rounds: int, k: int = 4):
    """Drive verify_round by hand, checking the invariants after each round; returns the
    final sequence, the target cache and the per-round results."""
    prompt = prompt_of(target)
    chain = SamplerChain(params, vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids)
    cache = target.make_cache()
    first = chain.select(prefill(target.model, prompt, cache)[None], prompt, (), params.seed, len(prompt))[0]
    sequence = [*prompt, first]
    drafter.start(sequence, params, params.seed)
    rule = select_rule(params, has_proposal_distribution=drafter.provides_distribution,
                       deterministic_proposals=drafter.deterministic)
    results = []
    for _ in range(rounds):
        r = verify_round(target.model, cache, chain, drafter, sequence, rule=rule, k=k, seed=params.seed)
        sequence.extend(r.emitted)
        results.append(r)
        assert cache_length(cache) == len(sequence) - 1
        if isinstance(drafter, DraftModelDrafter):
            assert drafter.offset + len(drafter.owed) == cache_length(cache)
            assert drafter.tokens + drafter.owed == sequence[:-1]
            assert cache_length(drafter.cache) == drafter.offset
    return sequence, cache, results


def assert_cache_matches_fresh_prefill(model, cache, cached_tokens, next_tokens):
    """Forwarding ``next_tokens`` on ``cache`` gives the logits a fresh prefill of
    ``cached_tokens + next_tokens`` gives."""
    got = model.model(mx.array([next_tokens]), cache=cache)[0, -1]
    fresh = model.make_cache()
    want = model.model(mx.array([[*cached_tokens, *next_tokens]]), cache=fresh)[0, -1]
    np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-4, rtol=1e-4)


BANNED_PARAMS = SamplerParams(temperature=0.0, ignore_eos=True, seed=0, logit_bias={BANNED: float("-inf")})


def test_kv_cache_length_is_exact_in_both_termination_regimes(target, twin):
    # All reject: every draft is the banned token.
    seq, cache, results = run_rounds(target, BannedTokenDrafter(twin), BANNED_PARAMS, rounds=6)
    assert all(r.accepted == 0 and r.proposed == 4 and len(r.emitted) == 1 for r in results)
    assert BANNED not in seq
    assert_cache_matches_fresh_prefill(target, cache, seq[:-1], seq[-1:])
    # All accept: the twin drafts exactly what the target picks.
    seq, cache, results = run_rounds(target, DraftModelDrafter(twin), GREEDY, rounds=6)
    assert all(r.accepted == 4 and len(r.emitted) == 5 for r in results)
    assert_cache_matches_fresh_prefill(target, cache, seq[:-1], seq[-1:])


@pytest.mark.parametrize("regime", ["all-reject", "all-accept", "mixed"])
def test_draft_cache_tracks_the_emitted_sequence_in_every_acceptance_regime(target, twin, noisy, regime):
    drafter, params = {
        "all-reject": (BannedTokenDrafter(twin), BANNED_PARAMS),
        "all-accept": (DraftModelDrafter(twin), GREEDY),
        "mixed": (DraftModelDrafter(noisy), GREEDY),
    }[regime]
    seq, _, results = run_rounds(target, drafter, params, rounds=8)
    accepted = [r.accepted for r in results]
    if regime == "all-reject":
        assert set(accepted) == {0}
    elif regime == "all-accept":
        assert set(accepted) == {4}
    else:
        assert len(set(accepted)) > 1
    # The drafter's rewound cache, plus what it owes, conditions on exactly the target's prefix.
    owed_and_pending = [*drafter.owed, seq[-1]]
    assert_cache_matches_fresh_prefill(drafter.draft, drafter.cache, drafter.tokens, owed_and_pending)


def test_a_fully_accepted_round_owes_its_last_proposal_and_the_next_round_pays_it(target, twin):
    drafter = DraftModelDrafter(twin)
    seq, cache, results = run_rounds(target, drafter, GREEDY, rounds=1)
    assert results[0].accepted == 4
    last_proposal = seq[-2]  # emitted = 4 drafts + the bonus token
    assert drafter.owed == [last_proposal]
    assert drafter.offset == cache_length(cache) - 1
    # The next round replays it at the head: its proposal comes from a cache that includes it.
    chain = SamplerChain(GREEDY, vocab_size=target.vocab_size)
    where = len(seq) - 2
    r = verify_round(target.model, cache, chain, drafter, seq, rule=GREEDY_ARGMAX, k=4, seed=0)
    seq.extend(r.emitted)
    assert r.accepted == 4
    assert drafter.tokens[where] == last_proposal  # paid: now in the draft cache
    assert drafter.tokens + drafter.owed == seq[:-1]
    assert drafter.owed == [seq[-2]] and drafter.offset + 1 == cache_length(cache)


# -- seed invariance ------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("which", ["draft-model", "prompt-lookup"])
def test_sampler_match_emits_the_plain_tokens_for_the_same_seed(target, noisy, temperature, which):
    prompt = prompt_of(target)
    for seed in (1, 2, 3):
        params = SamplerParams(temperature=temperature, ignore_eos=True, seed=seed)
        drafter = DraftModelDrafter(noisy) if which == "draft-model" else PromptLookupDrafter(1, 3)
        got, counters = speculative_tokens(target, drafter, prompt, params, 40)
        assert counters.rule == SAMPLER_MATCH
        assert got == target_only_tokens(target, prompt, params, 40), f"seed {seed}"
        if which == "draft-model":
            assert counters.rounds > 0
