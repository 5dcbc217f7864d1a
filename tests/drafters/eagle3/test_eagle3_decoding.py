"""EAGLE-3 decoding on real tiny checkpoints, through the engine's own round loop.

* temperature 0 is greedy target-only decoding token for token, for every form, with blocks scored
  in one forward and (probe failed) token by token, with the real drafter and with a scripted one
  whose drafts are partly the target's own tokens (accepts and rejects both happen); every round
  checks that the drafter holds the features of exactly the tokens the target's cache holds;
* above temperature 0 the default rule is sampler-match, so the stream is plain sampling's, token
  for token under the same seed; the stochastic opt-in (the session's override and the environment
  switch) runs modified rejection sampling;
* proposals come with q over the target's vocabulary: mass only on the draft vocabulary, shaped by
  the request's sampler;
* a proposal nobody verified is drafted again the same way.
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest
from target_only import speculative_tokens, target_only_tokens

from mlxcel.drafters.eagle3.drafter import Eagle3Drafter
from mlxcel.drafters.loading import load_model_drafter
from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import GBNF, compile_grammar
from mlxcel.engine.sampling.grammar_matcher import new_matcher
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import switches
from mlxcel.engine.speculative.acceptance import GREEDY_ARGMAX, SAMPLER_MATCH, STOCHASTIC
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.engine.speculative.target_features import prefill_with_features
from mlxcel.engine.speculative.verify import verify_round

GREEDY = SamplerParams(temperature=0.0, ignore_eos=True)
SAMPLED = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11, ignore_eos=True)
PROMPT = "The quick brown fox jumps over the lazy dog. The quick"


def drafter_for(lm, path) -> Eagle3Drafter:
    return load_model_drafter(path, target_vocab_size=lm.vocab_size)


def scripted(reference: list[int], wrong):
    """The real drafter class, but its drafts are the target's own greedy tokens (``reference``, by
    absolute position) except where ``wrong(position)``: the network, its cache bookkeeping and the
    round loop all run, with a known mix of accepts and rejects."""

    class Scripted(Eagle3Drafter):
        def propose(self, sequence, k):
            proposal = super().propose(sequence, k)
            start = len(sequence)
            proposal.tokens = [0 if start + i >= len(reference) else
                               (reference[start + i] + 1) % 300 if wrong(start + i) else reference[start + i]
                               for i in range(len(proposal.tokens))]
            return proposal

    return Scripted


def before_the_first_round(lm, drafter, prompt):
    """What the round loop does before its first round, by hand (bind, prefill with features, the
    first token, the drafter's context); the target cache, the greedy chain and the sequence."""
    drafter.bind(lm.model)
    cache = lm.make_cache()
    features = prefill_with_features(lm.model, prompt, cache, drafter.feature_layers)
    chain = SamplerChain(GREEDY, vocab_size=lm.vocab_size)
    sequence = prompt + [chain.select(features.logits, prompt)[0]]
    drafter.start(sequence, GREEDY, 0)
    drafter.observe_target(features)
    return cache, chain, sequence


@pytest.mark.parametrize("form", ["eagle3", "speculators", "gguf", "echo"])
@pytest.mark.parametrize("probe", ["pass", "fail"])
def test_temperature_zero_is_greedy_target_decoding(form, probe, e3_dirs, e3_target, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, probe)
    lm = e3_target
    prompt = list(lm.tokenizer.encode(PROMPT))
    expected = target_only_tokens(lm, prompt, GREEDY, 40)
    out, counters = speculative_tokens(lm, drafter_for(lm, e3_dirs[form]), prompt, GREEDY, 40, 4)
    assert out == expected
    assert counters.rule == GREEDY_ARGMAX and counters.rounds > 0 and counters.kind == "eagle3"
    assert counters.chain_rounds == (counters.rounds if probe == "fail" else 0)
    if form == "echo":  # the looping greedy stream takes the echo drafter's drafts
        assert counters.accepted > counters.rounds


def test_mixed_acceptance_keeps_drafter_and_target_in_step(e3_dirs, e3_target, monkeypatch):
    """Round by round: the output stays the greedy stream and the drafter holds the features of
    exactly the tokens the target's cache holds, through all-reject, partial and full acceptance."""
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    lm = e3_target
    prompt = list(lm.tokenizer.encode(PROMPT))
    reference = prompt + target_only_tokens(lm, prompt, GREEDY, 60)
    real = drafter_for(lm, e3_dirs["eagle3"])
    drafter = scripted(reference, lambda p: p % 11 in (0, 1, 5))(real.checkpoint, target_vocab_size=lm.vocab_size)
    cache, chain, sequence = before_the_first_round(lm, drafter, prompt)
    seen = set()
    while len(sequence) < len(reference) - 8:
        r = verify_round(lm.model, cache, chain, drafter, sequence, rule=GREEDY_ARGMAX, k=4, seed=0)
        sequence.extend(r.emitted)
        assert sequence == reference[: len(sequence)]
        assert cache_length(cache) == len(sequence) - 1 == drafter.context_length
        seen.add("all" if r.accepted == r.proposed else "none" if r.accepted == 0 else "some")
    assert seen == {"all", "none", "some"}


@pytest.mark.parametrize("probe", ["pass", "fail"])
def test_sampling_is_sampler_match_and_emits_plain_samplings_tokens(e3_diffuse, e3_dirs, e3_target, probe,
                                                                    monkeypatch):
    """EAGLE-3's default above temperature 0: every emitted token is the target's own draw at its
    position, so with the same seed the stream is plain sampling's, token for token: on a diffuse
    target (where a stream that were not the target's would leave it at once; drafts there are
    rarely the draw) and on the peaked one with the echo drafter (whose drafts often are)."""
    monkeypatch.setenv(switches.PROBE_ENV, probe)
    monkeypatch.delenv(switches.STOCHASTIC_ACCEPT_ENV, raising=False)
    target, drafter_dir = e3_diffuse
    prompt = list(target.tokenizer.encode(PROMPT))
    out, counters = speculative_tokens(target, drafter_for(target, drafter_dir), prompt, SAMPLED, 60, 4)
    assert counters.rule == SAMPLER_MATCH and counters.rounds > 0
    assert out == target_only_tokens(target, prompt, SAMPLED, 60)
    assert out != target_only_tokens(target, prompt, GREEDY, 60)
    prompt = list(e3_target.tokenizer.encode(PROMPT))
    out, counters = speculative_tokens(e3_target, drafter_for(e3_target, e3_dirs["echo"]), prompt, SAMPLED, 40, 4)
    assert counters.rule == SAMPLER_MATCH and counters.accepted > 0
    assert out == target_only_tokens(e3_target, prompt, SAMPLED, 40)


def test_the_stochastic_opt_in_is_rejection_sampling(e3_diffuse, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    target, drafter_dir = e3_diffuse
    prompt = list(target.tokenizer.encode(PROMPT))
    _, counters = speculative_tokens(target, drafter_for(target, drafter_dir), prompt, SAMPLED, 30, 4,
                                     stochastic=True)
    assert counters.rule == STOCHASTIC and counters.rounds > 0
    monkeypatch.setenv(switches.STOCHASTIC_ACCEPT_ENV, "1")
    _, counters = speculative_tokens(target, drafter_for(target, drafter_dir), prompt, SAMPLED, 30, 4)
    assert counters.rule == STOCHASTIC
    _, counters = speculative_tokens(target, drafter_for(target, drafter_dir), prompt, SAMPLED, 30, 4,
                                     stochastic=False)
    assert counters.rule == SAMPLER_MATCH  # the request's own override wins over the environment


def test_drafts_come_with_q_over_the_target_vocabulary(e3_dirs, e3_target):
    lm = e3_target
    params = SamplerParams(temperature=0.9, top_k=20, top_p=1.0, min_p=0.0, seed=3)
    drafter = drafter_for(lm, e3_dirs["eagle3"])
    drafter.bind(lm.model)
    prompt = list(lm.tokenizer.encode(PROMPT))
    features = prefill_with_features(lm.model, prompt, lm.make_cache(), drafter.feature_layers)
    sequence = prompt + [5]
    drafter.start(sequence, params, 3)
    drafter.observe_target(features)
    proposal = drafter.propose(sequence, 4)
    q = np.asarray(proposal.q)
    assert len(proposal.tokens) == 4 and q.shape == (4, lm.vocab_size)
    assert np.allclose(q.sum(axis=-1), 1.0, atol=1e-5)
    outside = ~np.asarray(mx.load(str(e3_dirs["eagle3"] / "model.safetensors"))["t2d"])  # the file's own map
    assert q[:, outside].sum() == 0 and outside.sum() == lm.vocab_size - 256  # no mass off the draft vocabulary
    assert all(q[i, t] > 0 for i, t in enumerate(proposal.tokens))
    assert ((q > 0).sum(axis=-1) <= 20).all()  # the request's top_k shaped q


def test_a_retracted_proposal_is_drafted_again_the_same_way(e3_dirs, e3_target):
    lm = e3_target
    drafter = drafter_for(lm, e3_dirs["speculators"])
    prompt = list(lm.tokenizer.encode(PROMPT))
    _, _, sequence = before_the_first_round(lm, drafter, prompt)
    first = drafter.propose(sequence, 4).tokens
    entries = drafter.entries
    again = drafter.propose(sequence, 4).tokens  # nobody verified the first: its chained entries go
    assert again == first and drafter.entries == entries == len(sequence) - 1
    assert mx.array_equal(mx.array(again), mx.array(first)).item()


def test_each_draft_chains_on_the_layers_own_output_before_its_norm(e3_dirs, e3_target):
    """EAGLE-3's chain, step by step: ``d_0`` from the pending token's entry; each later draft from an
    entry pairing the layer's previous output (pre-norm, not through ``fc``) with the draft before it.
    Checked on q itself (a plain softmax of each row here), not just on the drawn tokens."""
    lm = e3_target
    drafter = drafter_for(lm, e3_dirs["eagle3"])
    prompt = list(lm.tokenizer.encode(PROMPT))
    _, _, sequence = before_the_first_round(lm, drafter, prompt)
    drafter.start(sequence, SAMPLED, 4)  # again, now sampling: q is softmax(row)
    features = prefill_with_features(lm.model, prompt, lm.make_cache(), drafter.feature_layers)
    drafter.observe_target(features)
    proposal = drafter.propose(sequence, 3)
    binding, network = drafter.binding, drafter.network
    cache = network.make_cache()
    state = network.step(binding.embed(sequence[1:]), network.fuse(features.concat(drafter.feature_layers)), cache)
    for i, token in enumerate(proposal.tokens):
        expected = mx.softmax(binding.target_row(state[-1:]), axis=-1)[0]
        assert mx.allclose(proposal.q[i], expected, atol=1e-6).item(), i
        state = network.step(binding.embed([token]), state[-1:], cache)
    assert len(proposal.tokens) == 3



WORDS = ("the", "quick", "brown", "fox", "dog", "lazy", "jumps", "over")
WORD = "(" + " | ".join(f'"{w}"' for w in WORDS) + ")"
SENTENCE = f'root ::= {WORD} (" " {WORD}){{8,14}} "."'
SENTENCE_RE = re.compile(rf"({'|'.join(WORDS)})( ({'|'.join(WORDS)})){{8,14}}\.")


@pytest.mark.parametrize("stochastic", [False, True])
def test_a_grammar_masks_the_drafts_and_the_stream_keeps_to_it(e3_diffuse, stochastic, monkeypatch):
    """Under a grammar each draft row is masked by what the grammar allows; where nothing the draft
    vocabulary holds is allowed, the proposal ends there (a row of -inf has no q to draw from). Under
    sampler-match the stream is plain constrained sampling's, token for token; the stochastic rule
    keeps to the grammar too."""
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    target, drafter_dir = e3_diffuse
    grammar = compile_grammar(GBNF, SENTENCE)
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    prompt = list(target.tokenizer.encode(PROMPT))

    def matcher():
        return new_matcher(grammar, target.tokenizer, target.vocab_size, target.eos_token_ids)

    session = SpeculativeSession(drafter_for(target, drafter_dir), params, n_max=4, grammar=matcher(),
                                 stochastic=stochastic, eos_ids=target.eos_token_ids)
    out = [t for step in speculative_generate(target, session, prompt, max_tokens=120) for t in step.tokens]
    text = target.tokenizer.decode([t for t in out if t not in target.eos_token_ids])
    assert SENTENCE_RE.fullmatch(text), text
    assert session.counters.rounds > 0
    if not stochastic:
        chain = SamplerChain(params, vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids)
        plain = [s.token for s in generate_tokens(target.model, prompt, chain, cache=target.make_cache(),
                                                  max_tokens=120, seed=5, grammar=matcher())]
        assert out == plain
