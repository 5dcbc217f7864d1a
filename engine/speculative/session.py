"""Speculative decoding of one sequence: prefill, one plain first token, then verify rounds.

Read top to bottom: the target prefills the prompt and picks the first token exactly as plain
decoding does (``decode.prefill`` + ``SamplerChain.pick``); the drafter is started on the
sequence; then each ``verify_round`` drafts up to ``num_draft_tokens``, runs the target once,
and emits the accepted drafts plus one target token, until EOS or the token budget.

Randomness is keyed by (seed, absolute position), and every emitted token under greedy and
sampler-match is the target's own choice at its position, so those runs emit the same tokens
as plain decoding with the same seed, drafter or not (up to float differences between a block
forward and a one-token forward, which can flip a near-tie; see docs/speculative-acceptance.md).
Modified rejection sampling is distribution-equal to plain decoding, not token-equal.

``SpeculativeCounters`` keeps the run's totals for the acceptance report. Only rounds that
verified at least one draft count as rounds; a round with nothing proposed is a plain step.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxcel.engine.speculative.acceptance import parse_switch, select_rule
from mlxcel.engine.decode.plain import DEFAULT_PREFILL_STEP, prefill
from mlxcel.engine.errors import PromptError
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.random_keys import resolve_seed
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.target_features import prefill_with_features
from mlxcel.engine.speculative.verify import RoundResult, verify_round

log = logging.getLogger(__name__)

DEFAULT_NUM_DRAFT_TOKENS = 4
ACCEPT_DIAG_ENV = "MLXCEL_SPECULATIVE_ACCEPT_DIAG"


def diagnostics_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``MLXCEL_SPECULATIVE_ACCEPT_DIAG=1``: compute the closed forms for the diagnostic line."""
    env = os.environ if environ is None else environ
    return parse_switch(ACCEPT_DIAG_ENV, env.get(ACCEPT_DIAG_ENV))


@dataclass
class SpeculativeCounters:
    """Totals over a run's verify rounds."""

    rule: str
    rounds: int = 0
    proposed: int = 0  # every drafted position of every block
    positions_tested: int = 0  # drafted positions a rule examined
    accepted: int = 0
    plain_steps: int = 0  # rounds with nothing proposed
    sum_min: float = 0.0
    sum_prod: float = 0.0
    diagnosed: int = 0  # tested positions the two sums cover
    chain_rounds: int = 0  # rounds scored one forward per token (the exactness probe failed)

    def add(self, r: RoundResult) -> None:
        if r.proposed == 0:
            self.plain_steps += 1
            return
        self.rounds += 1
        self.chain_rounds += int(r.chain_verified)
        self.proposed += r.proposed
        self.positions_tested += r.tested
        self.accepted += r.accepted
        self.sum_min += r.sum_min
        self.sum_prod += r.sum_prod
        self.diagnosed += r.diagnosed

    @property
    def per_position_acceptance(self) -> float:
        return self.accepted / self.positions_tested if self.positions_tested else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def closed_form_sum_min(self) -> float:
        return self.sum_min / self.diagnosed if self.diagnosed else 0.0

    @property
    def closed_form_sum_prod(self) -> float:
        return self.sum_prod / self.diagnosed if self.diagnosed else 0.0


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
    drafter: Any,
    prompt: Sequence[int],
    params: SamplerParams,
    *,
    max_tokens: int = 256,
    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
    counters: SpeculativeCounters | None = None,
    stochastic: bool | None = None,
    diagnostics: bool | None = None,
    cache: list[Any] | None = None,
    prefill_step: int = DEFAULT_PREFILL_STEP,
) -> Iterator[SpeculativeStep]:
    """Generate up to ``max_tokens`` tokens after ``prompt`` with ``drafter`` proposing blocks.

    Pass ``counters`` (``SpeculativeCounters(rule="")``) to read the totals afterwards; its
    ``rule`` is filled in. ``stochastic`` overrides MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT and
    ``diagnostics`` MLXCEL_SPECULATIVE_ACCEPT_DIAG."""
    if len(prompt) == 0:
        raise PromptError("the prompt is empty")
    if num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
    if max_tokens <= 0:
        return
    seed = resolve_seed(params.seed)
    chain = SamplerChain(params, vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids,
                         tokenizer=target.tokenizer)
    if getattr(drafter, "greedy_only", False) and not params.greedy:
        log.warning("the %s drafter proposes greedy chains only; this sampling request is decoded plainly",
                    drafter.kind)
        num_draft_tokens = 0
    rule = select_rule(params, has_proposal_distribution=drafter.provides_distribution,
                       deterministic_proposals=drafter.deterministic,
                       argmax_verify=getattr(drafter, "argmax_verify", False), stochastic=stochastic)
    diagnostics = diagnostics_enabled() if diagnostics is None else diagnostics
    counters = counters if counters is not None else SpeculativeCounters(rule)
    counters.rule = rule
    eos = set() if params.ignore_eos else set(target.eos_token_ids)
    cache = target.make_cache() if cache is None else cache

    # Prefill and the first token: exactly plain decoding's.
    mx.reset_peak_memory()
    start = time.perf_counter()
    sequence = [int(t) for t in prompt]
    features = None
    if getattr(drafter, "wants_features", False):  # a model-based drafter reads the prompt's hidden states
        drafter.bind(target.model)
        features = prefill_with_features(target.model, sequence, cache, drafter.feature_layers, prefill_step)
        last_logits = features.logits
    else:
        last_logits = prefill(target.model, sequence, cache, prefill_step)[None]
    first = chain.select(last_logits, sequence, seed=seed, first_position=len(sequence))[0]
    prompt_time = time.perf_counter() - start
    decode_start = time.perf_counter()
    sequence.append(first)
    drafter.start(sequence, params, seed)
    if features is not None:
        drafter.observe_target(features)
    generated = [first]
    emitted = [first]

    while True:
        finish = _finish_reason(generated, emitted, eos, max_tokens)
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
        k = min(num_draft_tokens, remaining - 1)
        result = verify_round(target.model, cache, chain, drafter, sequence, rule=rule, k=k, seed=seed,
                              diagnostics=diagnostics)
        counters.add(result)
        emitted = _until_eos(result.emitted, eos)[:remaining]
        sequence.extend(emitted)
        generated.extend(emitted)


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def _finish_reason(generated: list[int], emitted: list[int], eos: set[int], max_tokens: int) -> str | None:
    if emitted and emitted[-1] in eos:
        return "stop"
    if len(generated) >= max_tokens:
        return "length"
    return None
