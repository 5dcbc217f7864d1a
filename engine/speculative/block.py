"""A verify round's block: what is prepared before the target's forward (the drafter's proposal, cut
where the sequence would end or a grammar forbids a draft) and what the round did after it.

The round itself (one forward, then the decision) is ``verify.verify_round`` for one sequence and
``decode.step.run_step`` for the rows of an engine step; the decision is ``decide.decide_rounds`` in
both. This module holds the data they share, so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher
from mlxcel.engine.speculative.acceptance import (
    ARGMAX_AGAINST_ARGMAX,
    GREEDY_ARGMAX,
    ChainOutcome,
    closed_forms,
    one_hot_rows,
)
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures


@dataclass
class RoundResult:
    """What one verify round did."""

    emitted: list[int]  # accepted drafts + one target token
    proposed: int  # drafts in the block
    accepted: int
    tested: int  # drafted positions the rule examined (a chain stops at its first rejection)
    sum_min: float = 0.0  # sums over the tested positions (only with diagnostics)
    sum_prod: float = 0.0
    diagnosed: int = 0  # tested positions the two sums cover
    chain_verified: bool = False  # the block was scored one forward per token (the probe failed)
    logits: mx.array | None = None  # the target rows the rule read, [rows, V] (row i: position + i)
    kept_features: TargetFeatures | None = None  # a model drafter's features of the tokens the cache kept
    grammar_cut: int = 0  # drafts cut before the forward because the grammar forbids the first of them


@dataclass
class PreparedRound:
    """A round before its forward: the drafter's proposal, cut where a grammar forbids a draft, and
    the block the target scores (``[pending, *drafts]``, the first at absolute ``position``)."""

    proposal: Proposal
    proposed: list[int]  # every drafted token the round can use (a grammar-cut draft included; none past an end)
    drafts: list[int]  # what the forward scores
    q: mx.array | None
    forbidden_q: mx.array | None  # the q row of the cut draft
    block: list[int]
    position: int

    @property
    def cut(self) -> int:
        return len(self.proposed) - len(self.drafts)


def prepare_round(drafter: Drafter, sequence: Sequence[int], k: int,
                  grammar: GrammarMatcher | None = None, ends: frozenset[int] = frozenset()) -> PreparedRound:
    """Step 1 of a round: ask ``drafter`` for up to ``k`` drafts after ``sequence``, keep none past
    the first that ends the sequence (``ends``), and cut them at the first one ``grammar`` forbids
    (module docstring)."""
    proposal = drafter.propose(sequence, k) if k > 0 else Proposal([])
    proposed = [int(t) for t in proposal.tokens]
    if len(proposed) > k:
        raise ValueError(f"the drafter proposed {len(proposed)} tokens for a block of {k}")
    q = proposal.q
    end = _first_end(proposed, ends)
    if end < len(proposed):
        proposed = proposed[:end]
        q = None if q is None else q[:end]
    drafts, forbidden_q = proposed, None
    if grammar is not None and proposed:
        n = grammar.admissible(proposed)
        if n < len(proposed):  # drafts[n] is forbidden: rejected without a forward
            drafts = proposed[:n]
            if q is not None:
                forbidden_q, q = q[n], q[:n]
    return PreparedRound(proposal, proposed, drafts, q, forbidden_q, [int(sequence[-1]), *drafts], len(sequence))


def _first_end(proposed: list[int], ends: frozenset[int]) -> int:
    """How many of ``proposed`` a round can use: all of them, or up to and including the first token
    of ``ends``. Emitting that token ends the sequence, so the drafts behind it could never be
    emitted whatever the rule decides: the forward need not score them. (A prompt-lookup draft that
    reaches the end of the copied text runs on into the chat template's closing tokens and whatever
    follows them in the context; its drafts there would widen the round's forward for nothing.)"""
    if ends:
        for i, t in enumerate(proposed):
            if t in ends:
                return i + 1
    return len(proposed)


def observe_round(drafter: Drafter, prep: PreparedRound, sequence: Sequence[int], result: RoundResult) -> None:
    """Step 5's drafter half: tell the drafter what the round emitted."""
    drafter.observe([*sequence, *result.emitted], prep.proposal, result.accepted)


def round_result(prep, outcome, p, logits, allowed, rule, chain, drafter, sequence, seed, diagnostics,
                 chain_verified=False) -> RoundResult:
    """The round's :class:`RoundResult` from the rule's ``outcome`` (a cut draft counted as
    rejected; the diagnostic closed forms filled when asked for)."""
    drafts, proposed = prep.drafts, prep.proposed
    if prep.cut and outcome.accepted == len(drafts) and outcome.tested == len(drafts):
        outcome = ChainOutcome(outcome.accepted, outcome.emitted, outcome.tested + 1)  # the cut draft was rejected
    result = RoundResult(outcome.emitted, len(proposed), outcome.accepted, outcome.tested if proposed else 0,
                         chain_verified=chain_verified, logits=logits, grammar_cut=prep.cut)
    if diagnostics and result.tested:
        _diagnose(result, rule, chain, logits, sequence, proposed, p, prep.proposal.q, drafter, seed, prep.position,
                  outcome, allowed)
    return result


def align_q(q: mx.array, vocab: int) -> mx.array:
    """The drafter's rows on the target's vocabulary (a drafter may pad its head differently)."""
    width = q.shape[-1]
    if width == vocab:
        return q
    if width > vocab:
        return q[:, :vocab]
    return mx.concatenate([q, mx.zeros((q.shape[0], vocab - width), dtype=q.dtype)], axis=-1)


def _diagnose(result, rule, chain, logits, sequence, drafts, p, q, drafter: Drafter, seed, position, outcome,
              allowed=None) -> None:
    """Fill the closed forms ``sum_x min(p, q)`` / ``sum_x p q`` over the tested positions
    (``drafts``: the whole proposal, a draft cut by the grammar included)."""
    n = result.tested
    vocab = logits.shape[-1]
    if rule == GREEDY_ARGMAX or (rule == ARGMAX_AGAINST_ARGMAX and chain.greedy):
        # Point masses on both sides: both forms are 1 exactly where the draft is the argmax.
        result.sum_min = result.sum_prod = float(outcome.accepted)
        result.diagnosed = n
        return
    if q is None and drafter.deterministic:
        q = one_hot_rows(drafts, vocab)
    if q is None:
        return  # no q: the closed forms are unknowable
    if p is None:
        p = chain.distribution(logits, sequence, drafts[: logits.shape[0] - 1], seed, position, allowed)
    smin, sprod = closed_forms(p[:n], align_q(q, vocab)[:n])
    result.sum_min = float(smin.sum().item())
    result.sum_prod = float(sprod.sum().item())
    result.diagnosed = n
