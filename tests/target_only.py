"""Target-only decoding: the reference token stream every speculative path is compared against."""

from __future__ import annotations

from mlxcel.engine.decode import generate_tokens
from mlxcel.engine.sampler_chain import SamplerChain
from mlxcel.engine.sampling_params import SamplerParams


def target_only_tokens(lm, prompt: list[int], params: SamplerParams, n: int) -> list[int]:
    """``n`` tokens after ``prompt`` from the plain decode loop, with the request's sampler and seed."""
    chain = SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
    return [s.token for s in generate_tokens(lm.model, prompt, chain, cache=lm.make_cache(), max_tokens=n,
                                             seed=params.seed or 0)]
