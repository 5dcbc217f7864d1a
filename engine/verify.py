"""One speculative verify round: draft a block, run the target once over it, accept a prefix,
rewind every cache to what was emitted.

The state between rounds is the token ``sequence`` (prompt + everything emitted) and the
target's KV cache, which always holds ``sequence[:-1]``: the last emitted token is *pending*,
not yet forwarded. A round

1. asks the drafter for up to ``k`` drafts ``d_0..d_{k-1}`` to follow ``sequence``;
2. runs the target once over ``[pending, d_0, ..., d_{k-1}]``: row ``i`` of the logits is the
   target's prediction for absolute position ``len(sequence) + i`` given ``sequence + d[:i]``;
3. turns every row into the target's choice or distribution with the request's sampler chain,
   each row seeing the history as it would be had the drafts before it been emitted
   (``appended=drafts``), with randomness keyed by absolute position;
4. lets the acceptance rule pick the accepted prefix and the one extra target token;
5. rewinds the target cache by the rejected drafts (it then holds ``new_sequence[:-1]``) and
   tells the drafter, which rewinds its own state.

A round with ``k == 0`` (or a drafter with nothing to propose) is exactly one plain decode step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .acceptance import (
    ARGMAX_AGAINST_ARGMAX,
    GREEDY_ARGMAX,
    SAMPLER_MATCH,
    SAMPLER_MATCH_NO_Q,
    STOCHASTIC,
    closed_forms,
    one_hot_rows,
    rejection_sample,
    walk_chain,
)
from .draft_proposal import Proposal
from .kv_cache import rewind
from .sampler_chain import SamplerChain


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


def verify_round(
    model: Any,
    cache: list[Any],
    chain: SamplerChain,
    drafter: Any,
    sequence: Sequence[int],
    *,
    rule: str,
    k: int,
    seed: int,
    diagnostics: bool = False,
) -> RoundResult:
    """Run one round for ``sequence`` (whose last token is pending) and return what it emitted.

    ``model`` is the target's mlx-lm module, ``cache`` its KV cache holding ``sequence[:-1]``.
    The caller appends ``result.emitted`` to its sequence."""
    proposal = drafter.propose(sequence, k) if k > 0 else Proposal([])
    drafts = [int(t) for t in proposal.tokens]
    if len(drafts) > k:
        raise ValueError(f"the drafter proposed {len(drafts)} tokens for a block of {k}")
    position = len(sequence)

    block = mx.array([[int(sequence[-1]), *drafts]])
    logits = model(block, cache=cache)[0]  # [K + 1, V], row i predicts position + i
    vocab = logits.shape[-1]

    p = None
    q = proposal.q
    if rule in (GREEDY_ARGMAX, SAMPLER_MATCH, SAMPLER_MATCH_NO_Q):
        # The very call plain decoding makes, one row per position: same choice, same key.
        outcome = walk_chain(chain.select(logits, sequence, drafts, seed, position), drafts)
    elif rule == ARGMAX_AGAINST_ARGMAX:
        choices = chain.adjusted_logits(logits, sequence, drafts).argmax(axis=-1).tolist()
        outcome = walk_chain(choices, drafts)
    elif rule == STOCHASTIC:
        p = chain.distribution(logits, sequence, drafts, seed, position)
        if drafts and q is None:
            raise ValueError("the stochastic rule needs the drafter's proposal distribution q")
        q_rows = _align(q, vocab) if drafts else mx.zeros((0, vocab))
        outcome = rejection_sample(p, q_rows, drafts, seed=seed, first_position=position)
    else:
        raise ValueError(f"unknown acceptance rule {rule!r}")

    result = RoundResult(outcome.emitted, len(drafts), outcome.accepted, outcome.tested if drafts else 0)
    if diagnostics and result.tested:
        _diagnose(result, rule, chain, logits, sequence, drafts, p, q, drafter, seed, position, outcome)

    rewind(cache, len(drafts) - outcome.accepted)
    drafter.observe([*sequence, *outcome.emitted], proposal, outcome.accepted)
    return result


def _align(q: mx.array, vocab: int) -> mx.array:
    """The drafter's rows on the target's vocabulary (a drafter may pad its head differently)."""
    width = q.shape[-1]
    if width == vocab:
        return q
    if width > vocab:
        return q[:, :vocab]
    return mx.concatenate([q, mx.zeros((q.shape[0], vocab - width), dtype=q.dtype)], axis=-1)


def _diagnose(result, rule, chain, logits, sequence, drafts, p, q, drafter, seed, position, outcome) -> None:
    """Fill the closed forms ``sum_x min(p, q)`` / ``sum_x p q`` over the tested positions."""
    n = result.tested
    vocab = logits.shape[-1]
    if rule == GREEDY_ARGMAX or (rule == ARGMAX_AGAINST_ARGMAX and chain.greedy):
        # Point masses on both sides: both forms are 1 exactly where the draft is the argmax.
        result.sum_min = result.sum_prod = float(outcome.accepted)
        result.diagnosed = n
        return
    if q is None and getattr(drafter, "deterministic", False):
        q = one_hot_rows(drafts, vocab)
    if q is None:
        return  # no q: the closed forms are unknowable
    if p is None:
        p = chain.distribution(logits, sequence, drafts, seed, position)
    smin, sprod = closed_forms(p[:n], _align(q, vocab)[:n])
    result.sum_min = float(smin.sum().item())
    result.sum_prod = float(sprod.sum().item())
    result.diagnosed = n
