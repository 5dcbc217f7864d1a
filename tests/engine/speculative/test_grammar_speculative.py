"""Constrained speculative decoding is constrained decoding, on real tiny MLX checkpoints.

* temperature 0: a constrained speculative run emits exactly the constrained greedy target stream,
  token for token, with prompt lookup, a draft model (the target's twin and a perturbed copy) and a
  DFlash drafter (block verified in one forward, and token by token when the exactness probe fails);
* temperature 0.8 under sampler-match: the same tokens as constrained plain sampling for the same seed;
* a draft the grammar forbids is rejected without a forward: the target scores only the drafts
  before it, the round counts the cut draft as proposed, tested and rejected, and the matcher is
  where the emitted sequence is after every round (the target cache holds the sequence less its
  pending token);
* a drafter that draws through ``DraftDraws`` proposes only what the grammar allows (no cut) and
  leaves the matcher where it found it.
"""

from __future__ import annotations

import re

import pytest
import tiny_drafters
from tiny_checkpoints import perturbed_copy

from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.drafters.loading import load_model_drafter
from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.cache.prefill import prefill
from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import GBNF, compile_grammar
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, new_matcher
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import switches
from mlxcel.engine.speculative.acceptance import GREEDY_ARGMAX, SAMPLER_MATCH, STOCHASTIC
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.engine.speculative.verify import verify_round

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the quick"
WORDS = ("the", "quick", "brown", "fox", "dog", "lazy", "jumps", "over")
WORD = "(" + " | ".join(f'"{w}"' for w in WORDS) + ")"
SENTENCE = f'root ::= {WORD} (" " {WORD}){{8,14}} "."'
SENTENCE_RE = re.compile(rf"({'|'.join(WORDS)})( ({'|'.join(WORDS)})){{8,14}}\.")
N = 80


@pytest.fixture(scope="module")
def grammar():
    return compile_grammar(GBNF, SENTENCE)


@pytest.fixture(scope="module")
def noisy(tiny_llama_dir, tmp_path_factory):
    return load_model(perturbed_copy(tiny_llama_dir, tmp_path_factory.mktemp("noisy") / "d", 0.9, seed=5))


def matcher(lm, grammar):
    return new_matcher(grammar, lm.tokenizer, lm.vocab_size, lm.eos_token_ids)


def prompt_of(lm) -> list[int]:
    return list(lm.tokenizer.encode(PROMPT, add_special_tokens=False))


def plain(lm, grammar, params: SamplerParams) -> list[int]:
    chain = SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
    return [s.token for s in generate_tokens(lm.model, prompt_of(lm), chain, cache=lm.make_cache(), max_tokens=N,
                                             seed=params.seed, grammar=matcher(lm, grammar))]


def speculative(lm, grammar, drafter, params: SamplerParams, k: int = 4, **kw):
    session = SpeculativeSession(drafter, params, n_max=k, grammar=matcher(lm, grammar), **kw)
    out = [t for step in speculative_generate(lm, session, prompt_of(lm), max_tokens=N) for t in step.tokens]
    return out, session.counters


def drafters(kind: str, lm, noisy):
    return {"lookup": PromptLookupDrafter(), "twin": DraftModelDrafter(lm), "noisy": DraftModelDrafter(noisy)}[kind]


@pytest.mark.parametrize("kind", ["lookup", "twin", "noisy"])
def test_temperature_zero_constrained_speculation_is_constrained_greedy_decoding(kind, tiny_llama, noisy, grammar):
    params = SamplerParams(temperature=0.0, seed=3)
    expected = plain(tiny_llama, grammar, params)
    assert SENTENCE_RE.fullmatch(tiny_llama.tokenizer.decode(expected))
    out, counters = speculative(tiny_llama, grammar, drafters(kind, tiny_llama, noisy), params)
    assert out == expected
    assert counters.rule == GREEDY_ARGMAX and counters.rounds > 0 and counters.accepted > 0
    if kind == "lookup":  # it proposes the prompt's punctuation and words the grammar does not allow there
        assert counters.grammar_cut > 0
    else:  # a draft model draws from its own constrained q: nothing to cut
        assert counters.grammar_cut == 0
    if kind == "twin":
        assert counters.accepted == counters.proposed


@pytest.mark.parametrize("kind", ["lookup", "noisy"])
def test_sampler_match_constrained_speculation_emits_the_constrained_plain_tokens(kind, tiny_llama, noisy, grammar):
    params = SamplerParams(temperature=0.8, seed=3)
    expected = plain(tiny_llama, grammar, params)
    out, counters = speculative(tiny_llama, grammar, drafters(kind, tiny_llama, noisy), params)
    assert counters.rule == SAMPLER_MATCH and counters.rounds > 0
    assert out == expected


def test_the_stochastic_rule_stays_inside_the_grammar(tiny_llama, noisy, grammar):
    for seed in range(4):
        params = SamplerParams(temperature=1.0, seed=seed)
        out, counters = speculative(tiny_llama, grammar, DraftModelDrafter(noisy), params, stochastic=True)
        assert counters.rule == STOCHASTIC
        assert SENTENCE_RE.fullmatch(tiny_llama.tokenizer.decode(out)), tiny_llama.tokenizer.decode(out)


class ScriptedDrafter(Drafter):
    """Proposes fixed blocks, one per round (the test's script)."""

    def __init__(self, blocks):
        self.blocks = list(blocks)

    def start(self, prompt, params, seed):
        pass

    def propose(self, sequence, k):
        return Proposal(self.blocks.pop(0)[:k])

    def observe(self, sequence, proposal, accepted):
        pass


class CountingModel:
    """The target, recording how many tokens each forward scores."""

    def __init__(self, model):
        self.model, self.widths = model, []

    def __call__(self, tokens, cache=None):
        self.widths.append(tokens.shape[1])
        return self.model(tokens, cache=cache)


def test_a_forbidden_draft_is_rejected_without_a_forward(tiny_llama, grammar):
    lm = tiny_llama
    enc = lambda text: list(lm.tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    chain = SamplerChain(SamplerParams(temperature=0.0), vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
    m = matcher(lm, grammar)
    emitted = enc("the")
    m.advance(emitted)
    sequence = prompt_of(lm) + emitted
    cache = lm.make_cache()
    prefill(lm.model, sequence[:-1], cache)  # the cache holds all but the pending token
    good = enc(" fox")
    forbidden = enc(" cat")  # not a word of the grammar
    assert m.admissible(good + forbidden) == len(good)
    model = CountingModel(lm.model)
    drafter = ScriptedDrafter([good + forbidden + good])
    r = verify_round(model, cache, chain, drafter, sequence, rule=GREEDY_ARGMAX, k=8, seed=0, grammar=m)
    assert model.widths == [1 + len(good)]  # the pending token and the drafts before the forbidden one
    assert r.proposed == len(good + forbidden + good) and r.grammar_cut == len(forbidden + good)
    assert r.tested == r.accepted + 1 and r.accepted <= len(good)
    assert m.consumed == len(emitted)  # the round left the matcher at the emitted sequence
    m.advance(r.emitted)  # what the round emitted is inside the grammar
    assert cache_length(cache) == len(sequence + r.emitted) - 1


def test_a_draft_models_proposal_is_inside_the_grammar_and_leaves_the_matcher_alone(tiny_llama, noisy, grammar):
    lm = tiny_llama
    prompt = prompt_of(lm)
    m = matcher(lm, grammar)
    drafter = DraftModelDrafter(noisy)
    drafter.grammar = m
    for params in (SamplerParams(temperature=0.0), SamplerParams(temperature=1.0, seed=1)):
        drafter.start(prompt + [prompt[-1]], params, 1)
        proposal = drafter.propose(prompt + [prompt[-1]], 6)
        assert len(proposal.tokens) == 6 and m.consumed == 0
        assert m.admissible(proposal.tokens) == 6
        if proposal.q is not None:  # q is the masked distribution the drafts were drawn from
            masks = allowed_rows(m.masks(proposal.tokens[:-1]), proposal.q.shape[-1])
            assert float((proposal.q * (1 - masks)).sum()) == 0.0


# -- DFlash ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return load_model(tiny_drafters.build_target(tmp_path_factory.mktemp("gq3") / "qwen3", "qwen3", seed=3))


@pytest.fixture(scope="module")
def dflash_dir(qwen3, tmp_path_factory):
    return tiny_drafters.build_dflash(tmp_path_factory.mktemp("gdf") / "dflash-b8", qwen3.path, layer_ids=(1, 3))


@pytest.mark.parametrize("probe", ["pass", "fail"])
def test_temperature_zero_constrained_dflash_is_constrained_greedy_decoding(probe, qwen3, dflash_dir, grammar,
                                                                            monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, probe)
    params = SamplerParams(temperature=0.0, seed=3)
    expected = plain(qwen3, grammar, params)
    drafter = load_model_drafter(dflash_dir, target_vocab_size=qwen3.vocab_size)
    out, counters = speculative(qwen3, grammar, drafter, params, k=6)
    assert out == expected
    assert counters.rule == GREEDY_ARGMAX and counters.rounds > 0 and counters.grammar_cut == 0
    assert counters.chain_rounds == (counters.rounds if probe == "fail" else 0)
