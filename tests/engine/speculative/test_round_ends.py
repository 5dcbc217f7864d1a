"""A block keeps no draft behind the first token that ends the sequence (``block.prepare_round``'s
``ends``): emitting that token ends generation, so the forward scores nothing it could not emit.

Checked on the tiny llama with real forwards: the cut is where it should be, and a cut round emits,
up to and including the ending token, exactly what the whole block emits (accepted prefix and the
target's own token alike), greedy and sampled, whether the end is accepted or rejected.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import pytest
from target_only import target_only_tokens

from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.cache.prefill import prefill
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import GREEDY_ARGMAX, SAMPLER_MATCH
from mlxcel.engine.speculative.block import prepare_round
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.engine.speculative.verify import verify_round

PROMPT_TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
GREEDY = SamplerParams(temperature=0.0, ignore_eos=True, seed=0)
SAMPLED = SamplerParams(temperature=0.7, ignore_eos=True, seed=11)


class Scripted(Drafter):
    """Proposes a fixed block, whatever the sequence."""

    kind = "scripted"
    deterministic = True

    def __init__(self, block: Sequence[int]):
        self.block = [int(t) for t in block]

    def start(self, prompt, params, seed) -> None:
        pass

    def propose(self, sequence, k: int) -> Proposal:
        return Proposal(self.block[:k])

    def observe(self, sequence, proposal, accepted: int) -> None:
        pass


def test_a_block_keeps_no_draft_past_the_first_ending_token():
    prep = prepare_round(Scripted([5, 9, 6, 9, 7]), [1, 2, 3], 5, ends=frozenset({9, 4}))
    assert prep.drafts == prep.proposed == [5, 9]
    assert prep.block == [3, 5, 9] and prep.cut == 0
    whole = prepare_round(Scripted([5, 9, 6, 9, 7]), [1, 2, 3], 5)
    assert whole.drafts == [5, 9, 6, 9, 7]
    # an ending token first leaves one draft; none among the drafts leaves them all
    assert prepare_round(Scripted([4, 5]), [1], 2, ends=frozenset({4})).drafts == [4]
    assert prepare_round(Scripted([5, 6]), [1], 2, ends=frozenset({4})).drafts == [5, 6]


def test_the_session_cuts_at_its_eos_unless_the_request_ignores_it():
    stops = SamplerParams(temperature=0.0, seed=0)
    session = SpeculativeSession(Scripted([5, 9, 6]), stops, n_max=3, eos_ids=[9])
    assert session.prepare([1, 2], remaining=10).drafts == [5, 9]
    assert SpeculativeSession(Scripted([5, 9, 6]), stops, n_max=3).prepare([1, 2], remaining=10).drafts == [5, 9, 6]
    # an EOS the request ignores ends nothing: the drafts behind it can still be emitted
    ignoring = SpeculativeSession(Scripted([5, 9, 6]), GREEDY, n_max=3, eos_ids=[9])
    assert ignoring.prepare([1, 2], remaining=10).drafts == [5, 9, 6]


def _round(lm, prompt: list[int], block: list[int], params: SamplerParams, rule: str, ends=frozenset()):
    cache = lm.make_cache()
    mx.eval(prefill(lm.model, prompt[:-1], cache))
    chain = SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
    result = verify_round(lm.model, cache, chain, Scripted(block), prompt, rule=rule, k=len(block),
                          seed=params.seed, ends=ends)
    return result, cache_length(cache)


@pytest.mark.parametrize("params, rule", [(GREEDY, GREEDY_ARGMAX), (SAMPLED, SAMPLER_MATCH)])
@pytest.mark.parametrize("wrong_at", [None, 1, 3])
def test_a_cut_round_emits_what_the_whole_block_emits_up_to_the_end(tiny_llama, params, rule, wrong_at):
    """The end is drafted fourth (index 3). A wrong draft before it (index 1) or at it (index 3)
    rejects there in both rounds; with none, the cut round accepts through the end."""
    lm = tiny_llama
    prompt = list(lm.tokenizer.encode(PROMPT_TEXT))
    want = target_only_tokens(lm, prompt, params, 10)
    block = want[:8]
    if wrong_at is not None:
        block[wrong_at] = (block[wrong_at] + 1) % lm.vocab_size
    end = frozenset({block[3]})
    cut, cut_len = _round(lm, prompt, block, params, rule, ends=end)
    whole, _ = _round(lm, prompt, block, params, rule)
    assert cut.proposed == 4 and whole.proposed == 8
    stop = 4 if wrong_at is None else wrong_at + 1  # emitted through the end, or through the rejection
    assert cut.emitted[:stop] == whole.emitted[:stop] == want[:stop]
    assert cut.accepted == min(whole.accepted, 4)
    assert cut_len == len(prompt) - 1 + len(cut.emitted)  # the cache holds the sequence but its pending token
