"""The acceptance decision of a verify round: every rule's one implementation, for any number of rows
at once. A round alone is a batch of one row; a shared verify forward's rows are decided together.

Each row is a block the target scored, ``[pending, *drafts]`` (:class:`DecideRow`): its logits, its
rule, its seed stream, sampler chain and grammar. :func:`decide_rounds` gives every row its
:class:`~mlxcel.engine.speculative.block.RoundResult` in four steps:

1. the grammar masks of every constrained row, in one ``fill_masks`` call (a matcher that fails
   there computes its own rows and fails alone);
2. every row's device work queued lazily: the rules that compare drafts with the target's own
   choice (``greedy-argmax``, ``sampler-match``, ``sampler-match-no-proposal-distribution``,
   ``argmax-against-argmax``, ``synthetic``) hand their block to ``batch_select.pick_draws`` (all
   argmax rows in one argmax, the sampled rows of one sampler shape in one graph, each row with its
   own chain values and position keys: the very ops ``SamplerChain.select`` runs for a plain decode
   step); the stochastic rule hands its block to ``batch_select.distribution_draws`` and queues, on
   its own p rows, the accept test and every candidate it could emit
   (``acceptance.rejection_candidates``); the synthetic rule queues its coins;
3. one evaluation and one host readback for every row (``batch_select.read_together``);
4. each row's walk on host integers (``walk_chain``, ``rejection_walk``, ``synthetic_accept``) and
   its ``RoundResult`` (``block.round_result``).

Row-wise ops give a row the same bits whatever its neighbours, so each row's outcome is the one it
gets decided alone (tests/engine/speculative/test_batch_decide.py, zero tolerance). A row whose own
work fails (its drafter's q missing, its grammar, its stages) fails alone; when the shared
evaluation fails, each row is evaluated alone so the one at fault fails alone.

A row without its bonus position (``bonus=False``: ``logits`` has one row per draft and no more)
tests its drafts and emits nothing after a clean sweep: what a chain-verified round
(``verify._chain_verify``) asks after each one-token forward, so that it too decides with these rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel.engine.sampling.batch_select import Draw, distribution_draws, pick_draws, read_together
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, allowed_rows, fill_masks
from mlxcel.engine.speculative.acceptance import (
    ARGMAX_AGAINST_ARGMAX,
    GREEDY_ARGMAX,
    SAMPLER_MATCH,
    SAMPLER_MATCH_NO_Q,
    STOCHASTIC,
    SYNTHETIC,
    ChainOutcome,
    rejection_candidates,
    rejection_walk,
    synthetic_accept,
    synthetic_coins,
    walk_chain,
)
from mlxcel.engine.speculative.block import PreparedRound, RoundResult, align_q, round_result
from mlxcel.engine.speculative.drafter import Drafter

CHOICE_RULES = (GREEDY_ARGMAX, SAMPLER_MATCH, SAMPLER_MATCH_NO_Q, ARGMAX_AGAINST_ARGMAX, SYNTHETIC)


@dataclass
class DecideRow:
    """One scored block to decide. ``allowed``: the grammar's mask rows when the caller has them
    (``[rows, V]`` bool), else they come from ``grammar``."""

    prep: PreparedRound
    logits: mx.array  # [len(prep.block), V]; [len(prep.drafts), V] without the bonus position
    chain: SamplerChain
    drafter: Drafter
    sequence: Sequence[int]
    rule: str
    seed: int
    diagnostics: bool = False
    synth_probs: Sequence[float] = ()
    grammar: GrammarMatcher | None = None
    bonus: bool = True
    allowed: mx.array | None = None


def _rows(row: DecideRow) -> int:
    return len(row.prep.drafts) + int(row.bonus)


def _masks(rows: Sequence[DecideRow]) -> list[mx.array | None]:
    """Every constrained row's mask rows, in one call; None where a row must compute its own
    (unconstrained, or the joint call failed)."""
    out: list[mx.array | None] = [r.allowed for r in rows]
    constrained = [(i, r) for i, r in enumerate(rows) if r.grammar is not None and r.allowed is None]
    if not constrained:
        return out
    try:
        masks = fill_masks([(r.grammar, r.prep.drafts) for _, r in constrained])
    except Exception:  # a matcher that fails (GrammarError) fails alone, computing its own rows
        return out
    for (i, r), mask in zip(constrained, masks):
        out[i] = allowed_rows(mask[:_rows(r)], r.logits.shape[-1])
    return out


def _own_mask(row: DecideRow) -> mx.array | None:
    if row.allowed is not None or row.grammar is None:
        return row.allowed
    return allowed_rows(row.grammar.masks(row.prep.drafts)[:_rows(row)], row.logits.shape[-1])


def _draw(row: DecideRow, allowed: mx.array | None) -> Draw:
    if row.rule not in CHOICE_RULES and row.rule != STOCHASTIC:
        raise ValueError(f"unknown acceptance rule {row.rule!r}")
    if row.logits.shape[0] != _rows(row):
        raise ValueError(f"{row.logits.shape[0]} logits rows for {len(row.prep.drafts)} drafts "
                         f"({'with' if row.bonus else 'without'} the bonus position)")
    return Draw(row.chain, row.logits, row.sequence, row.prep.drafts, row.seed, row.prep.position, allowed,
                argmax=row.rule == ARGMAX_AGAINST_ARGMAX)


def _stochastic(row: DecideRow, p: mx.array) -> list[mx.array]:
    prep, vocab = row.prep, row.logits.shape[-1]
    if (prep.drafts or prep.forbidden_q is not None) and prep.q is None:
        raise ValueError("the stochastic rule needs the drafter's proposal distribution q")
    q_rows = align_q(prep.q, vocab) if prep.drafts else mx.zeros((0, vocab))
    cut_q = align_q(prep.forbidden_q[None], vocab)[0] if prep.forbidden_q is not None else None
    accept, tokens = rejection_candidates(p, q_rows, prep.drafts, seed=row.seed, first_position=prep.position,
                                          forbidden_q=cut_q, bonus=row.bonus)
    return [accept, tokens]


def _queue(rows: Sequence[DecideRow], allowed: Sequence[mx.array | None]) -> tuple[list, list]:
    """Every row's lazy arrays (or its exception) and its (p or None, mask rows)."""
    arrays: list = [None] * len(rows)
    dists: list = [None] * len(rows)
    choice, stochastic = [], []
    for i, row in enumerate(rows):
        try:
            mask = allowed[i] if allowed[i] is not None else _own_mask(row)
            draw = _draw(row, mask)
        except Exception as exc:
            arrays[i] = exc
            continue
        (stochastic if row.rule == STOCHASTIC else choice).append((i, draw, mask))
    for (i, _, mask), pick in zip(choice, pick_draws([d for _, d, _ in choice])):
        row = rows[i]
        if isinstance(pick, Exception):
            arrays[i] = pick
        elif row.rule == SYNTHETIC:
            arrays[i] = [pick, synthetic_coins(row.seed, row.prep.position, len(row.prep.drafts)).view(mx.int32)]
        else:
            arrays[i] = [pick]
        dists[i] = (None, mask)
    for (i, _, mask), p in zip(stochastic, distribution_draws([d for _, d, _ in stochastic])):
        try:
            if isinstance(p, Exception):
                raise p
            arrays[i] = _stochastic(rows[i], p)
            dists[i] = (p, mask)
        except Exception as exc:
            arrays[i] = exc
    return arrays, dists


def _outcome(row: DecideRow, values: list) -> ChainOutcome:
    drafts = row.prep.drafts
    if row.rule == STOCHASTIC:
        accept, tokens = values
        return rejection_walk(accept, tokens, drafts, forbidden=row.prep.forbidden_q is not None)
    choices = [int(t) for t in values[0]]
    if not row.bonus:
        choices.append(-1)  # no bonus position: a clean sweep emits nothing (see ``_open``)
    if row.rule == SYNTHETIC:
        coins = np.asarray(values[1], dtype=np.int32).view(np.float32).tolist()
        outcome = synthetic_accept(choices, drafts, row.synth_probs, seed=row.seed,
                                   first_position=row.prep.position, eos=frozenset(row.chain.eos_token_ids),
                                   coins=coins)
    else:
        outcome = walk_chain(choices, drafts)
    return outcome if row.bonus else _open(outcome)


def _open(outcome: ChainOutcome) -> ChainOutcome:
    """A row without its bonus position: after a clean sweep, the drafts and nothing more."""
    if outcome.emitted and outcome.emitted[-1] == -1:
        return ChainOutcome(outcome.accepted, outcome.emitted[:-1], outcome.tested)
    return outcome


def decide_rounds(rows: Sequence[DecideRow]) -> list[RoundResult | Exception]:
    """Per row, its :class:`RoundResult`, or the exception its own work raised (the other rows are
    unaffected); one evaluation and one readback for all (the module docstring). The caller rewinds
    each row's cache and tells its drafter."""
    allowed = _masks(rows)
    arrays, dists = _queue(rows, allowed)

    def alone(i: int) -> list[mx.array]:
        (row_arrays,), _ = _queue([rows[i]], [allowed[i]])
        if isinstance(row_arrays, Exception):
            raise row_arrays
        return row_arrays

    values = read_together(arrays, alone)
    out: list[RoundResult | Exception] = []
    for row, got, dist in zip(rows, values, dists):
        if isinstance(got, Exception):
            out.append(got)
            continue
        try:
            p, allowed_i = dist
            outcome = _outcome(row, got)
            out.append(round_result(row.prep, outcome, p, row.logits, allowed_i, row.rule, row.chain, row.drafter,
                                    row.sequence, row.seed, row.diagnostics))
        except Exception as exc:
            out.append(exc)
    return out


def decide_one(row: DecideRow) -> RoundResult:
    """One row's decision (a batch of one); its own failure is raised."""
    (result,) = decide_rounds([row])
    if isinstance(result, Exception):
        raise result
    return result
