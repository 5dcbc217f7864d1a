"""Target-only decoding: the reference token stream every speculative path is compared against,
and the speculative stream itself with its counters."""

from __future__ import annotations

from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.session import SpeculativeCounters, SpeculativeSession


def target_only_tokens(lm, prompt: list[int], params: SamplerParams, n: int) -> list[int]:
    """``n`` tokens after ``prompt`` from the plain decode loop, with the request's sampler and seed."""
    chain = SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
    return [s.token for s in generate_tokens(lm.model, prompt, chain, cache=lm.make_cache(), max_tokens=n,
                                             seed=params.seed or 0)]


def speculative_tokens(lm, drafter, prompt: list[int], params: SamplerParams, n: int, k: int = 4,
                       **kw) -> tuple[list[int], SpeculativeCounters]:
    """``n`` tokens after ``prompt`` from ``speculative_generate`` (a session of ``k`` drafts a round;
    ``kw`` go to the session), with the session's counters."""
    session = SpeculativeSession(drafter, params, n_max=k, **kw)
    out = [t for step in speculative_generate(lm, session, prompt, max_tokens=n) for t in step.tokens]
    return out, session.counters
