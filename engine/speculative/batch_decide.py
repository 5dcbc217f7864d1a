"""Verify decisions for many rows in one pass: each row keeps its own rule, seed stream, sampler
chain and grammar, and all of them are evaluated together and read back once.

A shared verify forward (``decode.ragged``) gives each speculating row the logits of its block
``[pending, *drafts]``. :func:`decide_rounds` makes, for every row, the decision
``verify.decide_round`` makes for it alone, in four steps:

1. the grammar masks of every constrained row, in one ``fill_masks`` call (a matcher that fails
   there computes its own rows and fails alone);
2. every row's device work queued lazily: the rules that compare drafts with the target's own
   choice (``greedy-argmax``, ``sampler-match``, ``sampler-match-no-proposal-distribution``,
   ``argmax-against-argmax``, ``synthetic``) hand their block to ``batch_select.pick_draws`` (all
   argmax rows in one argmax, the sampled rows of one sampler shape in one graph, each row with its
   own chain values and position keys); the stochastic rule hands its block to
   ``batch_select.distribution_draws`` and queues, on its own p rows, the accept test and every
   candidate it could emit (``acceptance.rejection_candidates``); the synthetic rule queues its
   coins;
3. one evaluation and one host readback for every row (``batch_select.read_together``);
4. each row's walk on host integers (``walk_chain``, ``rejection_walk``, ``synthetic_accept``) and
   its ``RoundResult`` (``verify.round_result``).

The ops a row runs are the ones its decision alone runs, on the same values and keys, so each row's
outcome is its own, bit for bit (tests/engine/speculative/test_batch_decide.py, zero tolerance).
What keeps its own host syncs: the diagnostic closed forms (``diagnostics``, off by default), which
``round_result`` computes per row after the readback. A row whose own work fails (its drafter's q
missing, its grammar, its stages) fails alone; when the shared evaluation fails, each row is
evaluated alone so the one at fault fails alone.
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
    rejection_candidates,
    rejection_walk,
    synthetic_accept,
    synthetic_coins,
    walk_chain,
)
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.verify import PreparedRound, RoundResult, align_q, round_result

CHOICE_RULES = (GREEDY_ARGMAX, SAMPLER_MATCH, SAMPLER_MATCH_NO_Q, ARGMAX_AGAINST_ARGMAX, SYNTHETIC)


@dataclass
class DecideRow:
    """One row of a shared verify forward: ``verify.decide_round``'s arguments."""

    prep: PreparedRound
    logits: mx.array  # [len(prep.block), V]
    chain: SamplerChain
    drafter: Drafter
    sequence: Sequence[int]
    rule: str
    seed: int
    diagnostics: bool = False
    synth_probs: Sequence[float] = ()
    grammar: GrammarMatcher | None = None


def _masks(rows: Sequence[DecideRow]) -> list[mx.array | None]:
    """Every constrained row's mask rows ``[len(block), V]``, in one call; None where a row must
    compute its own (unconstrained, or the joint call failed)."""
    constrained = [(i, r) for i, r in enumerate(rows) if r.grammar is not None]
    out: list[mx.array | None] = [None] * len(rows)
    if not constrained:
        return out
    try:
        masks = fill_masks([(r.grammar, r.prep.drafts) for _, r in constrained])
    except Exception:  # a matcher that fails (GrammarError) fails alone, computing its own rows
        return out
    for (i, r), mask in zip(constrained, masks):
        out[i] = allowed_rows(mask, r.logits.shape[-1])
    return out


def _draw(row: DecideRow, allowed: mx.array | None) -> Draw:
    if row.rule not in CHOICE_RULES and row.rule != STOCHASTIC:
        raise ValueError(f"unknown acceptance rule {row.rule!r}")
    return Draw(row.chain, row.logits, row.sequence, row.prep.drafts, row.seed, row.prep.position, allowed,
                argmax=row.rule == ARGMAX_AGAINST_ARGMAX)


def _stochastic(row: DecideRow, p: mx.array) -> list[mx.array]:
    prep, vocab = row.prep, row.logits.shape[-1]
    if (prep.drafts or prep.forbidden_q is not None) and prep.q is None:
        raise ValueError("the stochastic rule needs the drafter's proposal distribution q")
    q_rows = align_q(prep.q, vocab) if prep.drafts else mx.zeros((0, vocab))
    cut_q = align_q(prep.forbidden_q[None], vocab)[0] if prep.forbidden_q is not None else None
    accept, tokens = rejection_candidates(p, q_rows, prep.drafts, seed=row.seed, first_position=prep.position,
                                          forbidden_q=cut_q)
    return [accept, tokens]


def _queue(rows: Sequence[DecideRow], allowed: Sequence[mx.array | None]) -> tuple[list, list]:
    """Every row's lazy arrays (or its exception) and its p (the stochastic rule's, else None)."""
    arrays: list = [None] * len(rows)
    dists: list = [None] * len(rows)
    choice, stochastic = [], []
    for i, row in enumerate(rows):
        try:
            mask = allowed[i]
            if mask is None and row.grammar is not None:
                mask = allowed_rows(row.grammar.masks(row.prep.drafts), row.logits.shape[-1])
            allowed_i = mask
            draw = _draw(row, allowed_i)
        except Exception as exc:
            arrays[i] = exc
            continue
        (stochastic if row.rule == STOCHASTIC else choice).append((i, draw, allowed_i))
    for (i, _, allowed_i), pick in zip(choice, pick_draws([d for _, d, _ in choice])):
        row = rows[i]
        if isinstance(pick, Exception):
            arrays[i] = pick
        elif row.rule == SYNTHETIC:
            arrays[i] = [pick, synthetic_coins(row.seed, row.prep.position, len(row.prep.drafts)).view(mx.int32)]
        else:
            arrays[i] = [pick]
        dists[i] = (None, allowed_i)
    for (i, _, allowed_i), p in zip(stochastic, distribution_draws([d for _, d, _ in stochastic])):
        try:
            if isinstance(p, Exception):
                raise p
            arrays[i] = _stochastic(rows[i], p)
            dists[i] = (p, allowed_i)
        except Exception as exc:
            arrays[i] = exc
    return arrays, dists


def _outcome(row: DecideRow, values: list):
    drafts = row.prep.drafts
    if row.rule == STOCHASTIC:
        accept, tokens = values
        return rejection_walk(accept, tokens, drafts, forbidden=row.prep.forbidden_q is not None)
    if row.rule == SYNTHETIC:
        choices, bits = values
        coins = np.asarray(bits, dtype=np.int32).view(np.float32).tolist()
        return synthetic_accept(choices, drafts, row.synth_probs, seed=row.seed, first_position=row.prep.position,
                                eos=frozenset(row.chain.eos_token_ids), coins=coins)
    return walk_chain(values[0], drafts)


def decide_rounds(rows: Sequence[DecideRow]) -> list[RoundResult | Exception]:
    """Per row, the :class:`RoundResult` ``verify.decide_round`` gives it alone, or the exception
    its own work raised (the other rows are unaffected); one evaluation and one readback for all
    (the module docstring). The caller rewinds each row's cache and tells its drafter."""
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
