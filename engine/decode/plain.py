"""Plain (non-speculative) decoding of one sequence: prefill the prompt, then one token per
model step, each a one-row step of ``decode.step`` on the sequence's own cache (``OwnCaches``),
pipelined: the next step's forward is queued over the token just picked before it is read back.

The token at absolute position ``i`` of the sequence is chosen by ``SamplerChain`` from the
logits of position ``i - 1`` with the sampler's history ``sequence[:i]`` and the random key of
position ``i`` (``random_keys.position_key``). A speculative verify round applies the same
chain to the same position, so under one seed both paths emit the same tokens.

A constrained sequence (``grammar``: its ``GrammarMatcher``) picks every token with the grammar's
mask applied (the mask of the next position is computed while the forward over the current token
runs), advances the matcher over it, and ends when the grammar does (finish reason "stop").

Cache invariant: at every yield (and after the loop ends) the cache holds exactly the KV
entries of ``sequence[:cache_length(cache)]``; it may or may not already include the last
emitted token, because the next step's forward is queued before that token is handed out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxcel.engine.cache.kv_cache import cache_length, rewind
from mlxcel.engine.cache.prefill import DEFAULT_PREFILL_STEP
from mlxcel.engine.decode.step import OwnCaches, Row, Sampling
from mlxcel.engine.errors import PromptError
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher

# Give freed buffers back to the allocator this often (as mlx-lm does) so a long generation
# does not hold on to every intermediate it ever allocated.
CLEAR_CACHE_EVERY = 256


@dataclass
class DecodeStep:
    """One generated token and the running performance figures."""

    token: int
    position: int  # absolute index of ``token`` in the sequence (prompt included)
    finish_reason: str | None  # None while generating; "stop" (EOS / stop callback) or "length"
    prompt_tokens: int  # prompt tokens actually run through the model (cache hits excluded)
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory_gb: float


def generate_tokens(
    model: Any,
    prompt: Sequence[int],
    chain: SamplerChain,
    *,
    cache: list[Any],
    max_tokens: int = 256,
    seed: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    prefill_step: int = DEFAULT_PREFILL_STEP,
    stop_check: Callable[[list[int]], bool] | None = None,
    grammar: GrammarMatcher | None = None,
) -> Iterator[DecodeStep]:
    """Generate up to ``max_tokens`` tokens after ``prompt``, one ``DecodeStep`` per token.

    ``cache`` may already hold a prefix of ``prompt`` (``cache_length(cache)`` tokens, which
    must equal ``prompt[:that]``); only the rest is prefilled. Generation stops after an EOS
    token (yielded, with finish_reason "stop"; never when the sampler's ``ignore_eos`` is set),
    when ``stop_check(generated_tokens)`` returns True, when ``grammar`` (the sequence's matcher,
    advanced over every token) is complete, or after ``max_tokens`` tokens."""
    if len(prompt) == 0:
        raise PromptError("the prompt is empty")
    if max_tokens <= 0:
        return
    eos = set(chain.eos_token_ids if eos_token_ids is None else eos_token_ids)
    if chain.params.ignore_eos:
        eos = set()
    history = list(prompt)

    # The model needs at least one new token to produce logits.
    cached = cache_length(cache)
    if cached >= len(prompt):
        rewind(cache, cached - len(prompt) + 1)
        cached = len(prompt) - 1

    mx.reset_peak_memory()
    start = time.perf_counter()
    own = OwnCaches(model, {0: cache})
    _prefill_head(own, cache, prompt[cached:-1], prefill_step)
    (forwarded,) = own.forward([Row(0, prompt[-1:], logits=1)])
    y = Sampling(chain, history, seed, grammar).pick(forwarded.logits)
    mx.eval(y)
    clock = _Clock(len(prompt) - cached, start)

    generated: list[int] = []
    while True:
        # Queue the forward over this token before reading it back, so building the next graph
        # overlaps with the evaluation of this one.
        last = len(generated) + 1 >= max_tokens
        if not last:
            (forwarded,) = own.forward([Row(0, y, logits=1)])
        token = int(y.item())
        history.append(token)
        generated.append(token)
        if grammar is not None:
            grammar.advance([token])
        stopped = token in eos or (grammar is not None and grammar.stopped) or (
            stop_check is not None and stop_check(generated))
        finish = "stop" if stopped else "length" if last else None
        yield clock.step(token, len(history) - 1, finish, len(generated))
        if finish is not None:
            return
        if len(generated) % CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()
        y = Sampling(chain, history, seed, grammar).pick(forwarded.logits)
        mx.async_eval(y)


class _Clock:
    """The running figures of a decode: prompt speed once, then decode speed over the tokens after
    the first (the first is the prefill's product)."""

    def __init__(self, prompt_tokens: int, start: float):
        self.prompt_tokens = prompt_tokens
        self.prompt_tps = prompt_tokens / max(time.perf_counter() - start, 1e-9)
        self.decode_start = time.perf_counter()

    def step(self, token: int, position: int, finish: str | None, n: int) -> DecodeStep:
        elapsed = time.perf_counter() - self.decode_start
        return DecodeStep(token=token, position=position, finish_reason=finish, prompt_tokens=self.prompt_tokens,
                          prompt_tps=self.prompt_tps, generation_tokens=n,
                          generation_tps=(n - 1) / elapsed if n > 1 and elapsed > 0 else 0.0,
                          peak_memory_gb=mx.get_peak_memory() / 1e9)


def _prefill_head(own: OwnCaches, cache: list[Any], head: Sequence[int], step: int) -> None:
    """All but the prompt's last token, in chunks of ``step`` whose logits are never computed (only
    the cache is evaluated); the last token then runs alone, as every decode step does."""
    step = max(1, int(step))
    for i in range(0, len(head), step):
        own.forward([Row(0, list(head[i:i + step]))])
        mx.eval([c.state for c in cache])
        mx.clear_cache()
