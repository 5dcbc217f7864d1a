"""The plain decode loop against naive references that recompute the whole sequence every step."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.cache.prefill import prefill
from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.errors import PromptError
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams

PROMPT = [5, 17, 42, 99, 7, 123, 64, 8, 250, 31, 77]


def chain_for(lm, **kw) -> SamplerChain:
    return SamplerChain(SamplerParams(**kw), vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids,
                        tokenizer=lm.tokenizer)


def run(lm, chain, prompt=PROMPT, n=24, seed=0, **kw) -> list[int]:
    steps = list(generate_tokens(lm.model, prompt, chain, cache=lm.make_cache(), max_tokens=n, seed=seed, **kw))
    return [s.token for s in steps]


def naive_reference(lm, chain, prompt, n, seed=0, eos=()) -> list[int]:
    """No cache: run the full sequence through the model for every token; pick with
    ``SamplerChain.select`` at the token's absolute position."""
    seq = list(prompt)
    out = []
    for _ in range(n):
        logits = lm.model(mx.array(seq)[None])[0, -1:]
        tok = chain.select(logits, seq, seed=seed, first_position=len(seq))[0]
        seq.append(tok)
        out.append(tok)
        if tok in eos:
            break
    return out


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_qwen"])
def test_greedy_equals_full_recompute(which, request):
    lm = request.getfixturevalue(which)
    chain = chain_for(lm, temperature=0.0, ignore_eos=True)
    want = naive_reference(lm, chain, PROMPT, 24)
    # Plain argmax, independent of the sampler chain.
    seq = list(PROMPT)
    for _ in range(24):
        logits = lm.model(mx.array(seq)[None])[0, -1]
        logits[list(lm.eos_token_ids)] = -float("inf")
        seq.append(int(logits.argmax()))
    assert want == seq[len(PROMPT):]
    for step in (1, 3, 512):  # chunked prefill must not change anything
        assert run(lm, chain, n=24, prefill_step=step) == want


def test_seeded_sampling_matches_select_reference_and_reproduces(tiny_llama):
    lm = tiny_llama
    chain = chain_for(lm, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)
    a = run(lm, chain, n=30, seed=1234)
    assert a == run(lm, chain, n=30, seed=1234)
    assert a == naive_reference(lm, chain, PROMPT, 30, seed=1234)
    assert a != run(lm, chain, n=30, seed=4321)


def test_randomness_is_per_absolute_position(tiny_llama):
    """Resuming from a longer prompt that already contains the first k generated tokens gives
    the same continuation: each position's draw depends on (seed, position, history) only."""
    lm = tiny_llama
    chain = chain_for(lm, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)
    full = run(lm, chain, n=20, seed=7)
    resumed = run(lm, chain, prompt=PROMPT + full[:8], n=12, seed=7)
    assert resumed == full[8:]


def test_eos_stops(tiny_llama):
    lm = tiny_llama
    chain = chain_for(lm, temperature=0.0, ignore_eos=True)
    free = run(lm, chain, n=12)
    target = free[4]
    first = free.index(target)
    stop_chain = SamplerChain(SamplerParams(temperature=0.0), vocab_size=lm.vocab_size, eos_token_ids=[target])
    steps = list(generate_tokens(lm.model, PROMPT, stop_chain, cache=lm.make_cache(), max_tokens=12))
    assert [s.token for s in steps] == free[: first + 1]
    assert steps[-1].finish_reason == "stop"
    assert all(s.finish_reason is None for s in steps[:-1])
    # ignore_eos keeps going through the same token.
    ignoring = SamplerChain(SamplerParams(temperature=0.0, ignore_eos=True, logit_bias={}),
                            vocab_size=lm.vocab_size, eos_token_ids=[])
    steps = list(generate_tokens(lm.model, PROMPT, ignoring, cache=lm.make_cache(), max_tokens=12,
                                 eos_token_ids=[target]))
    assert len(steps) == 12 and steps[-1].finish_reason == "length"


def test_stop_callback_and_length(tiny_llama):
    lm = tiny_llama
    chain = chain_for(lm, temperature=0.0, ignore_eos=True)
    steps = list(generate_tokens(lm.model, PROMPT, chain, cache=lm.make_cache(), max_tokens=50,
                                 stop_check=lambda toks: len(toks) == 5))
    assert len(steps) == 5 and steps[-1].finish_reason == "stop"
    steps = list(generate_tokens(lm.model, PROMPT, chain, cache=lm.make_cache(), max_tokens=7))
    assert [s.finish_reason for s in steps] == [None] * 6 + ["length"]
    assert [s.position for s in steps] == list(range(len(PROMPT), len(PROMPT) + 7))
    last = steps[-1]
    assert last.prompt_tokens == len(PROMPT) and last.generation_tokens == 7
    assert last.prompt_tps > 0 and last.generation_tps > 0 and last.peak_memory_gb > 0
    assert list(generate_tokens(lm.model, PROMPT, chain, cache=lm.make_cache(), max_tokens=0)) == []


def test_cache_invariant_and_prefix_reuse(tiny_llama):
    """After a run the cache holds a prefix of the sequence; a new request that extends the
    sequence reuses it and produces what a fresh cache produces."""
    lm = tiny_llama
    chain = chain_for(lm, temperature=0.0, ignore_eos=True)
    cache = lm.make_cache()
    steps = list(generate_tokens(lm.model, PROMPT, chain, cache=cache, max_tokens=6))
    seq = PROMPT + [s.token for s in steps]
    assert len(PROMPT) + 5 <= cache_length(cache) <= len(seq)
    follow_up = seq + [11, 12, 13]
    reused = [s.token for s in generate_tokens(lm.model, follow_up, chain, cache=cache, max_tokens=8)]
    assert reused == run(lm, chain, prompt=follow_up, n=8)
    # A cache holding the whole prompt (or more) is rewound so the last token is re-run.
    again = [s.token for s in generate_tokens(lm.model, follow_up, chain, cache=cache, max_tokens=8)]
    assert again == reused


def test_prefill_returns_last_logits(tiny_llama):
    lm = tiny_llama
    cache = lm.make_cache()
    got = prefill(lm.model, PROMPT, cache, step=4)
    want = lm.model(mx.array(PROMPT)[None])[0, -1]
    assert float(mx.abs(got - want).max()) < 1e-4
    assert cache_length(cache) == len(PROMPT)
    with pytest.raises(PromptError):
        prefill(lm.model, [], lm.make_cache())
    with pytest.raises(PromptError):
        next(generate_tokens(lm.model, [], chain_for(lm), cache=lm.make_cache()))
