"""Speculative decoding of one sequence, offline: what ``mlxcel generate`` runs with a drafter.

The target prefills the prompt and picks the first token exactly as plain decoding does
(``SpeculativeSession.prefill``); then each round is a one-row step of ``decode.step`` on the
sequence's own cache: the session drafts, the target runs once, and the accepted drafts plus one
target token are emitted, until EOS, the grammar's end or the token budget. The server runs the
same session per request, its rows among the others of its steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxcel.engine.cache.prefill import DEFAULT_PREFILL_STEP
from mlxcel.engine.decode.step import OwnCaches, Row, Verify, run_step
from mlxcel.engine.errors import PromptError
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, allowed_rows
from mlxcel.engine.sampling.random_keys import resolve_seed
from mlxcel.engine.speculative.session import SpeculativeSession


@dataclass
class SpeculativeStep:
    """Tokens emitted by one round (the first step: the prefill's token) and running figures."""

    tokens: list[int]
    finish_reason: str | None  # None while generating; "stop" (EOS) or "length"
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory_gb: float


def speculative_generate(
    target: LoadedModel,
    session: SpeculativeSession,
    prompt: Sequence[int],
    *,
    max_tokens: int = 256,
    cache: list[Any] | None = None,
    prefill_step: int = DEFAULT_PREFILL_STEP,
) -> Iterator[SpeculativeStep]:
    """Generate up to ``max_tokens`` tokens after ``prompt`` with ``session``'s drafter proposing
    blocks; read the totals from ``session.counters`` afterwards. A constrained session
    (``session.grammar``) ends when its grammar does (finish reason "stop")."""
    if len(prompt) == 0:
        raise PromptError("the prompt is empty")
    if max_tokens <= 0:
        return
    params = session.params
    seed = resolve_seed(params.seed)
    chain = SamplerChain(params, vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids,
                         tokenizer=target.tokenizer)
    eos = set() if params.ignore_eos else set(target.eos_token_ids)
    cache = target.make_cache() if cache is None else cache
    own = OwnCaches(target.model, {0: cache})

    # Prefill and the first token: exactly plain decoding's.
    mx.reset_peak_memory()
    start = time.perf_counter()
    sequence = [int(t) for t in prompt]
    last_logits = session.prefill(target.model, sequence, cache, prefill_step)
    grammar = session.grammar
    allowed = allowed_rows(grammar.masks(), last_logits.shape[-1]) if grammar is not None else None
    first = chain.select(last_logits, sequence, seed=seed, first_position=len(sequence), allowed=allowed)[0]
    prompt_time = time.perf_counter() - start
    decode_start = time.perf_counter()
    sequence.append(first)
    session.begin(sequence, seed)
    generated = []
    emitted = _record([first], eos, grammar, 1)
    generated.extend(emitted)

    while True:
        finish = _finish_reason(generated, emitted, eos, max_tokens, grammar)
        elapsed = time.perf_counter() - decode_start
        yield SpeculativeStep(
            tokens=emitted,
            finish_reason=finish,
            prompt_tokens=len(prompt),
            prompt_tps=len(prompt) / max(prompt_time, 1e-9),
            generation_tokens=len(generated),
            generation_tps=(len(generated) - 1) / elapsed if len(generated) > 1 and elapsed > 0 else 0.0,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
        )
        if finish is not None:
            return
        remaining = max_tokens - len(generated)
        verify = Verify(session, chain, sequence, room=remaining)
        (out,) = run_step(own, [Row(0, [], verify=verify)])
        if out.error is not None:
            raise out.error
        result = out.round
        emitted = _record(result.emitted, eos, grammar, remaining)
        session.record(result, len(emitted))
        sequence.extend(emitted)
        generated.extend(emitted)


def _record(tokens: list[int], eos: set[int], grammar: GrammarMatcher | None, most: int) -> list[int]:
    """The emitted tokens a sequence keeps: at most ``most``, up to the first EOS or the token that
    completes the grammar (which is advanced over them)."""
    kept = []
    for t in tokens[:most]:
        kept.append(t)
        if grammar is not None:
            grammar.advance([t])
        if t in eos or (grammar is not None and grammar.stopped):
            break
    return kept


def _finish_reason(generated: list[int], emitted: list[int], eos: set[int], max_tokens: int,
                   grammar: GrammarMatcher | None = None) -> str | None:
    if emitted and (emitted[-1] in eos or (grammar is not None and grammar.stopped)):
        return "stop"
    if len(generated) >= max_tokens:
        return "length"
    return None
