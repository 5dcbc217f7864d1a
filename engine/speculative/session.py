"""Speculative decoding of one sequence, as ``mlxcel generate`` and the server scheduler both run it.

A :class:`SpeculativeSession` owns everything per-sequence that is not the target's cache:

* the acceptance rule, chosen once from the drafter's declared traits and the request's sampler
  (``acceptance.select_rule``);
* the greedy-only gate: a greedy-only drafter (DSpark) given a sampling request *declines*: the
  session drafts nothing and every round is a plain step under the plain sampler, so the stream
  is exactly plain sampling, never the drafter's greedy chain;
* feature priming: a model-based drafter is bound to the target and starts with the hidden states
  of the whole context, taken from the prefill itself (:meth:`prefill`, or the caller's own
  prefill handed over with :meth:`adopt`; never a second pass over the prompt);
* the block policy: each round asks for at most ``n_max`` drafts, leaving room for the round's own
  token, and drafts nothing when fewer than ``n_min`` fit (:meth:`block`); in a shared verify
  forward the scheduler caps a row's drafts by what the forward costs (``verify_cost``);
* one set of counters (:class:`SpeculativeCounters`), which the CLI's acceptance line
  (``report``) and a response's ``timings`` both format;
* the sequence's grammar, when the request is constrained: every round verifies against the
  constrained p (``verify``), and the drafter is handed the matcher (``Drafter.grammar``) so a
  drafter that draws through ``DraftDraws`` proposes from its own masked q.

:func:`~mlxcel.engine.decode.speculative.speculative_generate` is the whole offline loop on top of
a session.

Randomness is keyed by (seed, absolute position), and every emitted token under greedy and
sampler-match is the target's own choice at its position, so those runs emit the same tokens
as plain decoding with the same seed, drafter or not (up to float differences between a block
forward and a one-token forward, which can flip a near-tie; see docs/speculative-acceptance.md).
Modified rejection sampling is distribution-equal to plain decoding, not token-equal.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxcel.engine.cache.prefill import DEFAULT_PREFILL_STEP, prefill
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import (
    GREEDY_ARGMAX,
    SAMPLER_MATCH,
    SAMPLER_MATCH_NO_Q,
    SYNTHETIC,
    select_rule,
)
from mlxcel.engine.speculative.block import PreparedRound, RoundResult, observe_round, prepare_round
from mlxcel.engine.speculative.decide import DecideRow
from mlxcel.engine.speculative.drafter import Drafter, ModelDrafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures, prefill_with_features
from mlxcel.engine.speculative.verify import verify_round

log = logging.getLogger(__name__)

# rules whose round with nothing drafted emits ``chain.select``'s choice, the plain step's own
QUIET_RULES = frozenset({GREEDY_ARGMAX, SAMPLER_MATCH, SAMPLER_MATCH_NO_Q})

@dataclass
class SpeculativeCounters:
    """Totals over a sequence's verify rounds. ``kind`` is what a response's ``timings`` report as
    ``draft_kind`` (the round loop: ``dflash`` for the whole DFlash family)."""

    rule: str
    kind: str = ""
    rounds: int = 0
    proposed: int = 0  # every drafted position of every block
    positions_tested: int = 0  # drafted positions a rule examined
    accepted: int = 0  # accepted drafts that were emitted (a round cut short by EOS or the budget keeps fewer)
    plain_steps: int = 0  # rounds with nothing proposed
    sum_min: float = 0.0
    sum_prod: float = 0.0
    diagnosed: int = 0  # tested positions the two sums cover
    chain_rounds: int = 0  # rounds scored one forward per token (the exactness probe failed)
    grammar_cut: int = 0  # drafts a grammar cut before the forward (the first of each cut was rejected)

    def add(self, r: RoundResult, used: int | None = None) -> int:
        """Count one round of which ``used`` emitted tokens were kept (all by default); return
        the accepted drafts counted."""
        if r.proposed == 0:
            self.plain_steps += 1
            return 0
        accepted = r.accepted if used is None else min(r.accepted, used)
        self.rounds += 1
        self.chain_rounds += int(r.chain_verified)
        self.grammar_cut += r.grammar_cut
        self.proposed += r.proposed
        self.positions_tested += r.tested
        self.accepted += accepted
        self.sum_min += r.sum_min
        self.sum_prod += r.sum_prod
        self.diagnosed += r.diagnosed
        return accepted

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


def decline_reason(drafter: Drafter | type[Drafter], params: SamplerParams) -> str | None:
    """Why a session with ``drafter`` would decline a request sampled with ``params`` (a greedy-only
    drafter given a sampling request), or None when it speculates."""
    if drafter.greedy_only and not params.greedy:
        return (f"the {drafter.kind} drafter proposes greedy chains only; this sampling request (temperature "
                f"{params.temperature:g}, top_k {params.top_k}) is decoded plainly rather than served the greedy "
                "stream")
    return None


class PlainSteps(Drafter):
    """What a declined session drafts with: nothing, so every round is one plain decode step."""

    kind = "none"

    def start(self, prompt: Sequence[int], params: SamplerParams, seed: int) -> None:
        pass

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        return Proposal([])

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        pass


class SpeculativeSession:
    """One sequence's speculative decoding: drafter, rule, block policy and counters.

    Life cycle: :meth:`prefill` (or :meth:`adopt` when the caller prefilled on its own), then
    :meth:`begin` once the first token is picked, then :meth:`round` and :meth:`record` per round.

    Args:
        drafter: this sequence's drafter (fresh: a session starts it).
        params: the request's sampler.
        n_max: the most drafts per round.
        n_min: a round that could hold fewer drafts than this drafts nothing.
        stochastic: the request's override of the stochastic opt-in (None: the environment's).
        diagnostics: compute the closed forms of the diagnostic line each round.
        kind: what the counters report as ``draft_kind`` (default: the drafter's kind).
        synth_probs: benchmarking only: accept draft ``i`` with this probability whatever the target
            says (``acceptance.synthetic_accept``); the output is then not the target's.
        grammar: the sequence's grammar matcher when the request is constrained. The session never
            advances it: whoever records the emitted tokens does.
        eos_ids: the target's EOS ids. Unless ``params.ignore_eos``, emitting one ends the sequence, so
            a block keeps no draft behind the first of them (:attr:`ends`, ``block.prepare_round``).
    """

    def __init__(self, drafter: Drafter, params: SamplerParams, *, n_max: int, n_min: int = 0,
                 stochastic: bool | None = None, diagnostics: bool = False, kind: str | None = None,
                 synth_probs: Sequence[float] = (), grammar: GrammarMatcher | None = None,
                 declined: str | None = None, eos_ids: Iterable[int] = ()):
        self.params = params
        self.grammar = grammar
        # the tokens whose emission ends the sequence
        self.ends = frozenset() if params.ignore_eos else frozenset(int(t) for t in eos_ids)
        reason = declined or decline_reason(drafter, params)
        self.declined_because = reason  # None: the session speculates
        self.declined = reason is not None
        if self.declined:
            drafter = PlainSteps()  # the declined drafter is never started, asked or told anything
        self.drafter = drafter
        self.n_max = 0 if self.declined else max(0, n_max)
        self.n_min = min(max(0, n_min), self.n_max)
        self.diagnostics = diagnostics
        # False: this session's rounds verify their blocks token by token (a block forward of the target
        # is not bitwise its one-token forwards, as the server's probe found); None: the drafter's own
        # gate (a probe-gated drafter asks the probe, any other verifies a block in one forward)
        self.block_exact: bool | None = None
        self.seed = 0
        self._features: TargetFeatures | None = None
        rule = select_rule(params, has_proposal_distribution=drafter.provides_distribution,
                           deterministic_proposals=drafter.deterministic, argmax_verify=drafter.argmax_verify,
                           stochastic=stochastic)
        self.synth_probs = tuple(synth_probs)
        if self.synth_probs and not self.declined:
            rule = SYNTHETIC
        self.counters = SpeculativeCounters(rule=rule, kind=kind or drafter.kind)
        # peeked first drafts (Drafter.peek) compared with the token emitted instead (evidence)
        self.peek_hits = self.peeks_tested = 0
        self._peeked: int | None = None  # the token peeked at the last prepare, until its round is recorded
        if reason is not None:
            log.warning("%s", reason)

    @property
    def rule(self) -> str:
        return self.counters.rule

    @property
    def model_drafter(self) -> ModelDrafter | None:
        """The drafter when it reads the target's hidden states."""
        drafter = self.drafter
        return drafter if isinstance(drafter, ModelDrafter) else None

    # -- before the first round ---------------------------------------------------------------

    def prefill(self, model: Any, tokens: Sequence[int], cache: list[Any],
                step: int = DEFAULT_PREFILL_STEP) -> mx.array:
        """Prefill ``tokens`` into ``cache`` and return the last position's logits ``[1, V]``; for
        a model-based drafter keep every position's features for :meth:`begin`."""
        drafter = self.model_drafter
        if drafter is None:
            return prefill(model, tokens, cache, step)[None]
        drafter.bind(model)
        self._features = prefill_with_features(model, tokens, cache, drafter.feature_layers, step)
        return self._features.logits

    def adopt(self, model: Any, features: TargetFeatures | None) -> None:
        """The caller prefilled the context itself and kept its features (the server's slots,
        ``target_features.chunk_with_features``): bind a model-based drafter and hand it those at
        :meth:`begin`. ``features`` must cover every token the target cache holds."""
        drafter = self.model_drafter
        if drafter is not None:
            drafter.bind(model)
            self._features = features

    def begin(self, sequence: Sequence[int], seed: int) -> None:
        """Start the drafter on ``sequence`` (its last token pending, as between rounds)."""
        self.seed = seed
        self.drafter.grammar = self.grammar
        self.drafter.start(sequence, self.params, seed)
        drafter = self.model_drafter
        if drafter is not None and self._features is not None:
            drafter.observe_target(self._features)
        self._features = None

    # -- rounds -------------------------------------------------------------------------------

    def block(self, remaining: int, cap: int | None = None) -> int:
        """Drafts to ask for when ``remaining`` tokens may still be emitted: at most ``n_max`` (and at
        most ``cap``, a shared forward's per-row cap, ``verify_cost.VerifyCost.draft_cap``), leaving
        room for the round's own token; 0 (a plain step) when fewer than ``n_min`` fit."""
        k = min(self.n_max, remaining - 1, self.n_max if cap is None else cap)
        return k if k >= max(1, self.n_min) else 0

    def round(self, model: Any, cache: list[Any], chain: SamplerChain, sequence: Sequence[int],
              remaining: int) -> RoundResult:
        """One verify round for ``sequence`` (whose last token is pending; ``cache`` holds the
        rest). The caller appends the emitted tokens it keeps and calls :meth:`record`."""
        return verify_round(model, cache, chain, self.drafter, sequence, rule=self.rule, k=self.block(remaining),
                            seed=self.seed, diagnostics=self.diagnostics, synth_probs=self.synth_probs,
                            grammar=self.grammar, ends=self.ends, block_exact=self.block_exact)

    @property
    def batchable(self) -> bool:
        """Whether this session's rounds can be scored in a forward shared with other rows
        (``cache.ragged``): its drafter does not read the target's hidden states or cache (a model
        drafter's block width is gated by the exactness probe and needs the forward's features)."""
        return self.model_drafter is None

    def prepare(self, sequence: Sequence[int], remaining: int, cap: int | None = None) -> PreparedRound:
        """The first half of a batched round (:attr:`batchable` sessions): the proposal and the block
        to forward (at most ``cap`` drafts, see :meth:`block`). The caller forwards ``block`` with the
        other rows and calls :meth:`decide`. When ``cap`` alone stops the row from drafting and its
        drafter :attr:`~Drafter.peeks`, the token it would have drafted first is kept, and
        :meth:`record` compares it with the token emitted (:attr:`evidence`)."""
        k = self.block(remaining, cap)
        self._peeked = None
        if k == 0 and cap == 0 and self.drafter.peeks and self.block(remaining) > 0:
            self._peeked = self.drafter.peek(sequence)
        return prepare_round(self.drafter, sequence, k, self.grammar, self.ends)

    def decide_row(self, prep: PreparedRound, logits: mx.array, chain: SamplerChain,
                   sequence: Sequence[int]) -> DecideRow:
        """This session's decision of ``prep``'s block, scored as ``logits`` (``[len(prep.block), V]``),
        as a row of ``decide.decide_rounds`` (``decode.step.run_step`` decides a step's rows together,
        then drops each row's rejected tail and tells its drafter, ``block.observe_round``)."""
        return DecideRow(prep, logits, chain, self.drafter, sequence, rule=self.rule, seed=self.seed,
                         diagnostics=self.diagnostics, synth_probs=self.synth_probs, grammar=self.grammar)

    @property
    def quiet_ok(self) -> bool:
        """Whether a round of this session with nothing drafted picks its token exactly as a plain
        decode step does (``chain.select`` at the same position and key): then the scheduler may run
        such a round inside its pipelined plain steps (:meth:`quiet`, ``server/runtime/run_ahead.py``).
        True for the rules that walk the sampler's own choices (greedy, sampler-match) on a batchable
        drafter; never for the stochastic or the synthetic rule, nor under a grammar."""
        return self.batchable and self.grammar is None and self.rule in QUIET_RULES

    def quiet(self, prep: PreparedRound, sequence: Sequence[int], token: int) -> RoundResult:
        """A round with nothing drafted (``prep.drafts`` empty) whose token ``token`` was picked as a
        plain step picks it (:attr:`quiet_ok`): the result its :meth:`decide` gives, the drafter told
        the same. The caller emits and records it as any round."""
        if prep.drafts or prep.cut:
            raise ValueError("a quiet round drafts nothing")
        result = RoundResult([int(token)], len(prep.proposed), 0, 0)
        observe_round(self.drafter, prep, sequence, result)
        return result

    def record(self, result: RoundResult, used: int | None = None) -> int:
        """Count ``result``, of which ``used`` emitted tokens were kept; return the accepted drafts counted.
        A round prepared with a peeked token scores it against the token emitted (:attr:`evidence`)."""
        peeked, self._peeked = self._peeked, None
        if peeked is not None and result.emitted and not result.proposed:
            self.peeks_tested += 1
            self.peek_hits += int(int(result.emitted[0]) == peeked)
        return self.counters.add(result, used)

    @property
    def evidence(self) -> tuple[int, int]:
        """What this row's drafts are worth so far, as ``(accepted, tested)`` first-draft-equivalent
        positions: the drafted positions its rule tested and accepted, plus every peeked token
        compared with the token emitted in its place (a hit is what a one-draft block would have had
        accepted: under greedy exactly, when sampling with the same chance ``p(d)``). The report's
        counters hold only the drafted ones; a shared forward's cap reads both
        (``verify_cost.VerifyCost.draft_cap``)."""
        c = self.counters
        return c.accepted + self.peek_hits, c.positions_tested + self.peeks_tested
