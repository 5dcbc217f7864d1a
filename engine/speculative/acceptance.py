"""Acceptance rules for speculative decoding, and the selector that picks one for a request.

A verify round gives, for each drafted position ``i``, the target's effective distribution
``p_i`` (built by the sampler chain with the history as it would be had drafts ``0..i-1`` been
emitted) and, when the drafter can say, the distribution ``q_i`` it drew draft ``d_i`` from.
A rule walks the chain of drafts, accepts a prefix, and emits exactly one more token: the
target's own token at the first rejected position, or a bonus token when every draft survived.

The rules and what each guarantees:

* ``greedy-argmax``: accept while the draft equals the target's argmax; emit the argmax.
  Exactly greedy target decoding. Chosen whenever the sampler is argmax (temperature 0 or
  top_k 1), before any distribution tensor exists.
* ``sampler-match``: accept while the draft equals a fresh draw from ``p_i``; emit that draw on
  either branch. Every emitted token is the draw plain decoding would make at that position,
  so the stream *is* a target-only sample (with position-keyed randomness: the same tokens
  as plain decoding under the same seed). Accepts with probability ``sum_x p(x) q(x)``.
* ``stochastic`` (modified rejection sampling, opt-in): accept ``d`` iff ``u * q(d) <= p(d)``
  with ``u ~ U[0, 1)``; at the first rejection emit a draw from ``normalize(relu(p - q))`` and
  stop; after a clean sweep emit a bonus draw from ``p``. Distribution-equal to target-only
  sampling (not token-equal) and accepts with probability ``sum_x min(p(x), q(x))``, the most
  any distribution-preserving rule can.
* ``sampler-match-no-proposal-distribution``: the stochastic rule was asked for but the
  drafter cannot report ``q``; sampler-match runs instead and the id says so.
* ``argmax-against-argmax``: accept while the draft equals the target's argmax whatever the
  temperature; emit the argmax. Biased above temperature 0 (the stream is the greedy one).
  The default of the model-based drafters (DFlash, DSpark, Muse Glimmer assistant, MTP), as in
  the reference system; they report ``q``, so the stochastic opt-in makes them lossless.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel.engine.sampling.chain import draw_one
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.speculative.switches import stochastic_accept_enabled

STOCHASTIC = "stochastic"
GREEDY_ARGMAX = "greedy-argmax"
SAMPLER_MATCH = "sampler-match"
SAMPLER_MATCH_NO_Q = "sampler-match-no-proposal-distribution"
ARGMAX_AGAINST_ARGMAX = "argmax-against-argmax"
SYNTHETIC = "synthetic"
RULES = (STOCHASTIC, GREEDY_ARGMAX, SAMPLER_MATCH, SAMPLER_MATCH_NO_Q, ARGMAX_AGAINST_ARGMAX, SYNTHETIC)

# What the report prints in parentheses after the numbers.
RULE_DESCRIPTIONS = {
    STOCHASTIC: "stochastic (modified rejection sampling; lossless, acceptance-optimal)",
    GREEDY_ARGMAX: "greedy argmax (temperature 0; exactly greedy target decoding)",
    SAMPLER_MATCH: "sampler-match (draft accepted iff it equals the target's own draw; lossless)",
    SAMPLER_MATCH_NO_Q: "sampler-match (stochastic acceptance requested, but the drafter reports no "
                        "proposal distribution; lossless)",
    ARGMAX_AGAINST_ARGMAX: "argmax-against-argmax (target argmax; not a sample above temperature 0)",
    SYNTHETIC: "synthetic (drafts accepted at set rates whatever the target says; benchmarking only, the output "
               "is not the target's)",
}

# Streams of random_keys.position_key: 0 is the emitted-token draw shared with plain decoding.
ACCEPT_STREAM = 1
RESIDUAL_STREAM = 2
SYNTH_STREAM = 5  # 3 is XTC's coin, 4 the drafters' draws


def select_rule(
    params: SamplerParams,
    *,
    has_proposal_distribution: bool,
    deterministic_proposals: bool = False,
    argmax_verify: bool = False,
    stochastic: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The rule id a request runs under.

    Greedy samplers get ``greedy-argmax`` first, so no distribution is ever built for them.
    ``argmax_verify`` marks drafters verified against the target argmax by default (the
    model-based drafters); with the stochastic opt-in and a ``q`` they run modified rejection
    sampling instead.
    A drafter with ``deterministic_proposals`` (q one-hot, e.g. prompt lookup) always runs
    sampler-match: there both rules accept with probability p(d), so there is nothing to opt into.
    """
    if params.greedy:
        return GREEDY_ARGMAX
    if argmax_verify:
        # Model-based drafters report q, so the opt-in makes them lossless; without it they keep
        # the reference system's argmax rule (the greedy stream, reported as such).
        if has_proposal_distribution and stochastic_accept_enabled(stochastic, environ):
            return STOCHASTIC
        return ARGMAX_AGAINST_ARGMAX
    if deterministic_proposals:
        return SAMPLER_MATCH
    if stochastic_accept_enabled(stochastic, environ):
        return STOCHASTIC if has_proposal_distribution else SAMPLER_MATCH_NO_Q
    return SAMPLER_MATCH


@dataclass(frozen=True)
class ChainOutcome:
    """What a rule decided for one drafted block."""

    accepted: int  # drafts accepted, a prefix of the block
    emitted: list[int]  # drafts[:accepted] + one target token
    tested: int  # drafted positions the rule actually examined

    @property
    def fully_accepted(self) -> bool:
        return self.tested == self.accepted


def walk_chain(choices: Sequence[int], drafts: Sequence[int]) -> ChainOutcome:
    """Greedy, sampler-match and argmax-against-argmax: accept while each draft equals the
    target's choice at its position (``choices`` has one more entry than ``drafts``, the bonus
    position) and emit the target's choice where they part."""
    if len(choices) != len(drafts) + 1:
        raise ValueError(f"need {len(drafts) + 1} target choices for {len(drafts)} drafts, got {len(choices)}")
    n = 0
    while n < len(drafts) and int(drafts[n]) == int(choices[n]):
        n += 1
    tested = n + 1 if n < len(drafts) else n
    return ChainOutcome(n, [int(t) for t in drafts[:n]] + [int(choices[n])], tested)


def synthetic_coins(seed: int, first_position: int, k: int) -> mx.array:
    """``[k]`` lazy uniforms: the coins ``synthetic_accept`` flips for drafts ``0..k-1``."""
    if k == 0:
        return mx.zeros((0,), dtype=mx.float32)
    return mx.stack([mx.random.uniform(key=position_key(seed, first_position + n, SYNTH_STREAM)) for n in range(k)])


def synthetic_accept(choices: Sequence[int], drafts: Sequence[int], probs: Sequence[float], *, seed: int,
                     first_position: int, eos: frozenset[int] = frozenset(),
                     coins: Sequence[float] | None = None) -> ChainOutcome:
    """Synthetic acceptance, for benchmarking a verify loop at a chosen acceptance rate (llama-server's
    ``--spec-synth-rates``): draft ``i`` is accepted with probability ``probs[i]`` (conditional on
    the drafts before it), whatever the target chose; a drafted end-of-generation token is never
    accepted; the first refusal emits the target's own choice and ends the chain, a clean sweep adds
    the target's bonus token. The emitted stream is *not* the target's: this rule proves nothing and
    is only ever selected by those flags. Coins are keyed by position (stream ``SYNTH_STREAM``,
    :func:`synthetic_coins`); ``coins`` are those already read back, else they are read here."""
    if coins is None:
        coins = synthetic_coins(seed, first_position, len(drafts)).tolist()
    n = 0
    while n < len(drafts):
        if float(coins[n]) >= probs[n] or int(drafts[n]) in eos:
            break
        n += 1
    tested = n + 1 if n < len(drafts) else n
    return ChainOutcome(n, [int(t) for t in drafts[:n]] + [int(choices[n])], tested)


def residual_distribution(p_row: mx.array, q_row: mx.array) -> mx.array:
    """``normalize(relu(p - q))``: what a rejected position emits from. Falls back to ``p`` in
    the float-only corner where the residual has no mass (then p == q and rejection cannot
    happen in exact arithmetic)."""
    r = mx.maximum(p_row - q_row, 0.0)
    total = r.sum()
    return mx.where(total > 0, r / mx.maximum(total, 1e-30), p_row)


def accept_tests(p: mx.array, q: mx.array, drafts: Sequence[int], *, seed: int, first_position: int) -> mx.array:
    """Each draft's acceptance test, queued: ``u_i * q_i(d_i) <= p_i(d_i)`` (and ``p_i(d_i) > 0``) with
    ``u_i`` from the row's accept stream at its absolute position; ``[K]`` bool. ``p`` has a row per
    draft, and may have the bonus position's after them."""
    k = len(drafts)
    if p.shape[0] not in (k, k + 1) or q.shape[0] != k:
        raise ValueError(f"rejection sampling: p rows {p.shape[0]}, q rows {q.shape[0]}, drafts {k}")
    if not k:
        return mx.zeros((0,), dtype=mx.bool_)
    idx = mx.array([int(d) for d in drafts])
    rows = mx.arange(k)
    p_d = p[rows, idx]
    q_d = q[rows, idx]
    u = mx.stack([mx.random.uniform(key=position_key(seed, first_position + i, ACCEPT_STREAM)) for i in range(k)])
    return (u * q_d <= p_d) & (p_d > 0)


def rejection_sample(
    p: mx.array,
    q: mx.array,
    drafts: Sequence[int],
    *,
    seed: int,
    first_position: int,
    forbidden_q: mx.array | None = None,
) -> ChainOutcome:
    """Modified rejection sampling over one block, read back at once: :func:`rejection_candidates`
    then :func:`rejection_walk` (the one implementation; ``decide.decide_rounds`` runs the same two
    for many rows with one readback).

    ``p``: ``[K + 1, V]`` target rows (the last is the bonus position); ``q``: ``[K, V]`` rows the
    drafts were drawn from; row ``i`` is absolute position ``first_position + i``. The accept
    uniform and the residual draw use their own key streams, the bonus uses the emitted-token
    stream. A draft the target gives probability 0 is never accepted (``u * q <= 0`` could hold
    at u == 0), so nothing outside p's support is ever emitted.

    ``forbidden_q`` is the ``[V]`` q row of a draft that followed ``drafts`` in the proposal and was
    cut before the forward because p gives it no mass (a grammar forbids it). Testing it could only
    reject it, so after a clean sweep row ``K`` is that rejection: its residual
    ``normalize(relu(p_K - forbidden_q))`` is drawn, not a bonus from ``p_K`` (which would bias the
    stream), and the outcome counts the cut draft as tested.
    """
    accept, tokens = rejection_candidates(p, q, drafts, seed=seed, first_position=first_position,
                                          forbidden_q=forbidden_q)
    mx.eval(accept, tokens)
    return rejection_walk(accept.tolist(), tokens.tolist(), drafts, forbidden=forbidden_q is not None)


def rejection_candidates(p: mx.array, q: mx.array, drafts: Sequence[int], *, seed: int, first_position: int,
                         forbidden_q: mx.array | None = None, bonus: bool = True) -> tuple[mx.array, mx.array]:
    """Modified rejection sampling's randomness queued for one readback: ``(accept [K] bool, tokens
    [K + 1] int32)``, where ``tokens[i]`` is the residual draw ``normalize(relu(p_i - q_i))`` row ``i``
    emits if draft ``i`` is the first rejected (its own key stream) and ``tokens[K]`` what a clean
    sweep emits (the bonus from ``p_K`` on the emitted-token stream, or the residual of the cut
    draft's ``forbidden_q``). :func:`rejection_walk` picks the outcome. The price of one readback is
    ``K`` residual draws where a chain uses one. Without ``bonus`` (``p`` has only the drafts' rows)
    ``tokens`` stops at ``K`` rows: a clean sweep emits nothing."""
    k = len(drafts)
    if not bonus and forbidden_q is not None:
        raise ValueError("a cut draft's residual is drawn at the bonus position")
    accept = accept_tests(p, q, drafts, seed=seed, first_position=first_position)
    tokens = [draw_one(residual_distribution(p[i], q[i]), position_key(seed, first_position + i, RESIDUAL_STREAM))
              for i in range(k)]
    if forbidden_q is not None:
        tokens.append(draw_one(residual_distribution(p[k], forbidden_q),
                               position_key(seed, first_position + k, RESIDUAL_STREAM)))
    elif bonus:
        tokens.append(draw_one(p[k], position_key(seed, first_position + k)))
    if not tokens:
        return accept, mx.zeros((0,), dtype=mx.int32)
    return accept, mx.stack(tokens).astype(mx.int32)


def rejection_walk(accept: Sequence[bool], tokens: Sequence[int], drafts: Sequence[int],
                   forbidden: bool = False) -> ChainOutcome:
    """The outcome from the read-back :func:`rejection_candidates` (``forbidden``: a cut draft's
    ``forbidden_q`` was given). Without a bonus candidate, a clean sweep emits the drafts alone."""
    k = len(drafts)
    for i, ok in enumerate(accept):
        if not ok:
            return ChainOutcome(i, [int(t) for t in drafts[:i]] + [int(tokens[i])], i + 1)
    tail = [int(tokens[k])] if len(tokens) > k else []
    return ChainOutcome(k, [int(t) for t in drafts] + tail, k + 1 if forbidden else k)


def closed_forms(p: mx.array, q: mx.array) -> tuple[mx.array, mx.array]:
    """Per row: ``sum_x min(p, q)`` (what rejection sampling accepts at) and ``sum_x p * q``
    (what sampler-match accepts at). Rows of equal count."""
    return mx.minimum(p, q).sum(axis=-1), (p * q).sum(axis=-1)


def one_hot_rows(tokens: Sequence[int], vocab_size: int) -> mx.array:
    """``[len(tokens), V]`` point masses: the q of a deterministic proposal."""
    return (mx.arange(vocab_size)[None, :] == mx.array([int(t) for t in tokens])[:, None]).astype(mx.float32)
