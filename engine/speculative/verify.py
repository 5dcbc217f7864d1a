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
   tells the drafter, which rewinds its own state. Recurrent layers (Qwen3.5 / Qwen3-Next
   gated-delta, LFM2 convolutions, ...) are cut back with the ``decode.recurrent.StateTape`` the
   block forward recorded.

Model-based drafters (``engine.speculative.drafter.ModelDrafter``: DFlash, DSpark, Muse Glimmer assistant,
MTP) condition on the target's hidden states. For them step 2 also returns those
(``target_features``), step 5 hands the drafter the rows of the tokens the target kept (the
pending token and the accepted drafts), and the exactness probe (``exactness_probe``) decides
whether step 2 is one forward over the block or, where a block forward is not bit-identical to
one-token forwards, one forward per token ("chain decoding", exact by construction). Their
default rule is argmax-against-argmax (``acceptance.select_rule``); because they report ``q``,
modified rejection sampling is available to them as an opt-in. ``RoundResult.logits`` carries
the target rows the rule read, so any rule (or a diagnostic) can run on them.

A round with ``k == 0`` (or a drafter with nothing to propose) is exactly one plain decode step.

A constrained sequence (``grammar``: its ``GrammarMatcher``, at the emitted sequence) changes two
things. Before the forward, the proposal is cut at its first draft the grammar forbids: p gives that
draft no mass, so every rule would reject it, and the drafts behind it could never be emitted; the
forward covers only what can survive, and the cut draft counts as proposed, tested and rejected.
While the forward runs, the matcher gives the mask of every row (it walks the kept drafts and comes
back), and the rule reads each row's p with its mask applied. The emitted token at the cut is what
testing the draft would have emitted: the target's choice for greedy / sampler-match / argmax, and
for the stochastic rule the residual of the cut draft's q (``acceptance.rejection_sample``). The
round leaves the matcher where it found it: whoever records the emitted tokens advances it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxcel.engine.decode.kv_cache import rewind
from mlxcel.engine.decode.recurrent import StateTape
from mlxcel.engine.platform.argmax import argmax_last
from mlxcel.engine.sampling.chain import SamplerChain, sample
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, allowed_rows
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.speculative.acceptance import (
    ACCEPT_STREAM,
    ARGMAX_AGAINST_ARGMAX,
    GREEDY_ARGMAX,
    RESIDUAL_STREAM,
    SAMPLER_MATCH,
    SAMPLER_MATCH_NO_Q,
    STOCHASTIC,
    SYNTHETIC,
    ChainOutcome,
    closed_forms,
    one_hot_rows,
    rejection_sample,
    residual_distribution,
    synthetic_accept,
    walk_chain,
)
from mlxcel.engine.speculative.drafter import Drafter, ModelDrafter
from mlxcel.engine.speculative.exactness_probe import block_verdict
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.target_features import TargetFeatures, forward_with_features


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


def verify_round(
    model: Any,
    cache: list[Any],
    chain: SamplerChain,
    drafter: Drafter,
    sequence: Sequence[int],
    *,
    rule: str,
    k: int,
    seed: int,
    diagnostics: bool = False,
    block_exact: bool | None = None,
    synth_probs: Sequence[float] = (),
    grammar: GrammarMatcher | None = None,
    ends: frozenset[int] = frozenset(),
) -> RoundResult:
    """Run one round for ``sequence`` (whose last token is pending) and return what it emitted.

    ``model`` is the target's mlx-lm module, ``cache`` its KV cache holding ``sequence[:-1]``.
    The caller appends ``result.emitted`` to its sequence.

    A :class:`ModelDrafter` gets the target's hidden states: the forward goes through
    ``target_features`` and, after the rewind, the drafter is handed the rows of the tokens the
    cache kept. Whether the block is scored in one forward or token by token is ``block_exact``;
    None asks the exactness probe when the drafter is ``probe_gated`` (and means one forward
    otherwise). ``synth_probs`` are the per-position probabilities of the benchmarking-only
    synthetic rule (``acceptance.synthetic_accept``). ``grammar`` constrains the round (module
    docstring); it is left unchanged. ``ends``: the tokens whose emission ends the sequence (its EOS
    ids, unless the request ignores EOS): no draft behind the first of them is scored."""
    model_drafter = drafter if isinstance(drafter, ModelDrafter) else None
    if model_drafter is not None and model_drafter.reads_target_cache and k > 0:
        model_drafter.read_target_cache(cache)
    prep = prepare_round(drafter, sequence, k, grammar, ends)
    proposal, drafts, q, forbidden_q = prep.proposal, prep.drafts, prep.q, prep.forbidden_q
    position = prep.position
    layers = tuple(model_drafter.feature_layers) if model_drafter is not None else None
    block = prep.block
    if block_exact is None:
        block_exact = True
        if drafts and model_drafter is not None and model_drafter.probe_gated:
            # every width this drafter may verify at must clear the probe (ModelDrafter.probe_widths)
            widths = sorted({len(block), *model_drafter.probe_widths(k)})
            block_exact = all(block_verdict(model, w, vocab_size=chain.vocab_size).exact for w in widths)

    tape = None
    if block_exact or not drafts:
        # a cache with recurrent layers records what it needs to be cut back to the kept prefix
        tape = StateTape.for_cache(model, cache) if drafts else None
        with tape.recording() if tape is not None else nullcontext():
            features = _forward(model, block, cache, layers)
        logits = features.logits
        allowed = None
        if grammar is not None:
            mx.async_eval(logits)  # the masks are computed while the forward runs
            allowed = allowed_rows(grammar.masks(drafts), logits.shape[-1])
        outcome, p = _decide(rule, chain, logits, sequence, drafts, q, seed, position, synth_probs, allowed,
                             forbidden_q)
        forwarded = len(block)
    else:
        outcome, p, features, forwarded, allowed = _chain_verify(model, cache, chain, rule, sequence, drafts, q, seed,
                                                                 position, layers, grammar, forbidden_q)
        logits = features.logits
    result = round_result(prep, outcome, p, logits, allowed, rule, chain, drafter, sequence, seed, diagnostics,
                     chain_verified=not block_exact and bool(drafts))

    kept = outcome.accepted + 1  # the pending token and the accepted drafts
    rewind(cache, forwarded - kept, tape)
    if model_drafter is not None:
        result.kept_features = features.rows(0, kept)
        model_drafter.observe_target(result.kept_features)
    drafter.observe([*sequence, *outcome.emitted], proposal, outcome.accepted)
    return result


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


def decide_round(prep: PreparedRound, logits: mx.array, chain: SamplerChain, drafter: Drafter,
                 sequence: Sequence[int], *, rule: str, seed: int, diagnostics: bool = False,
                 synth_probs: Sequence[float] = (), grammar: GrammarMatcher | None = None) -> RoundResult:
    """Steps 3-4 for a block scored elsewhere (a batched forward): ``logits`` are the target's rows
    ``[len(prep.block), V]`` for ``prep.block``. The same decision ``verify_round`` makes on its own
    forward's rows; the caller then drops ``len(prep.block) - (accepted + 1)`` tokens from the cache
    and tells the drafter (:func:`observe_round`)."""
    allowed = allowed_rows(grammar.masks(prep.drafts), logits.shape[-1]) if grammar is not None else None
    outcome, p = _decide(rule, chain, logits, sequence, prep.drafts, prep.q, seed, prep.position, synth_probs,
                         allowed, prep.forbidden_q)
    return round_result(prep, outcome, p, logits, allowed, rule, chain, drafter, sequence, seed, diagnostics)


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


def _forward(model: Any, tokens: list[int], cache: list[Any], layers: tuple[int, ...] | None) -> TargetFeatures:
    if layers is None:
        return TargetFeatures(model(mx.array([tokens]), cache=cache)[0])
    return forward_with_features(model, tokens, cache, layers)


def _decide(rule, chain, logits, sequence, drafts, q, seed, position, synth_probs=(), allowed=None, forbidden_q=None):
    """The acceptance rule over a scored block: (outcome, p or None). ``allowed``: the grammar's
    mask rows; ``forbidden_q``: the q row of a draft cut after ``drafts`` (``rejection_sample``)."""
    vocab = logits.shape[-1]
    p = None
    if rule == SYNTHETIC:
        choices = chain.select(logits, sequence, drafts, seed, position, allowed)
        outcome = synthetic_accept(choices, drafts, synth_probs, seed=seed, first_position=position,
                                   eos=frozenset(chain.eos_token_ids))
    elif rule in (GREEDY_ARGMAX, SAMPLER_MATCH, SAMPLER_MATCH_NO_Q):
        # The very call plain decoding makes, one row per position: same choice, same key.
        outcome = walk_chain(chain.select(logits, sequence, drafts, seed, position, allowed), drafts)
    elif rule == ARGMAX_AGAINST_ARGMAX:
        choices = argmax_last(chain.adjusted_logits(logits, sequence, drafts, allowed)).tolist()
        outcome = walk_chain(choices, drafts)
    elif rule == STOCHASTIC:
        p = chain.distribution(logits, sequence, drafts, seed, position, allowed)
        if (drafts or forbidden_q is not None) and q is None:
            raise ValueError("the stochastic rule needs the drafter's proposal distribution q")
        q_rows = align_q(q, vocab) if drafts else mx.zeros((0, vocab))
        cut_q = align_q(forbidden_q[None], vocab)[0] if forbidden_q is not None else None
        outcome = rejection_sample(p, q_rows, drafts, seed=seed, first_position=position, forbidden_q=cut_q)
    else:
        raise ValueError(f"unknown acceptance rule {rule!r}")
    return outcome, p


def _chain_verify(model, cache, chain, rule, sequence, drafts, q, seed, position, layers, grammar=None,
                  forbidden_q=None):
    """Score the block one forward per token (what plain decoding computes, bit for bit), deciding
    each draft as soon as its row exists and stopping at the first rejection, so nothing past the
    emitted sequence is ever forwarded (no rewind; this works on any cache, a wrapped sliding
    window included). Every decision is the one the block path makes for that row: the same
    history, the same position keys, the same mask. Returns (outcome, None, features of the rows,
    rows, the mask rows or None)."""
    history = [int(t) for t in sequence]
    block = [int(sequence[-1]), *drafts]
    allowed = allowed_rows(grammar.masks(drafts), chain.vocab_size) if grammar is not None else None
    parts: list[TargetFeatures] = []
    for i, token in enumerate(block):
        part = _forward(model, [token], cache, layers)
        parts.append(part)
        draft = drafts[i] if i < len(drafts) else None
        q_row = q[i] if (q is not None and draft is not None) else None
        row_allowed = allowed[i : i + 1] if allowed is not None else None
        accepted, emit = _row_verdict(rule, chain, part.logits, history, draft, q_row, seed, position + i,
                                      row_allowed, forbidden_q if draft is None else None)
        if not accepted:
            outcome = ChainOutcome(i, drafts[:i] + [int(emit)], min(i + 1, len(drafts)))
            return outcome, None, TargetFeatures.join(parts), len(parts), allowed
        history.append(int(draft))
    raise AssertionError("unreachable: the bonus row always ends the round")


def _row_verdict(rule, chain, row, history, draft, q_row, seed, position, allowed=None, forbidden_q=None):
    """One row of a chain-verified block: (draft accepted?, the token to emit if the round ends
    here). ``draft`` None is the bonus row; ``forbidden_q`` the q row of a draft cut there by the
    grammar (then the stochastic rule draws that rejection's residual). Row for row the block rules'
    decisions."""
    if rule == STOCHASTIC:
        p = chain.distribution(row, history, (), seed, position, allowed)[0]
        if draft is None and forbidden_q is not None:
            cut_q = align_q(forbidden_q[None], p.shape[-1])[0]
            return False, sample(residual_distribution(p, cut_q), position_key(seed, position, RESIDUAL_STREAM))
        if draft is None:
            return False, sample(p, position_key(seed, position))
        if q_row is None:
            raise ValueError("the stochastic rule needs the drafter's proposal distribution q")
        q_row = align_q(q_row[None], p.shape[-1])[0]
        u = mx.random.uniform(key=position_key(seed, position, ACCEPT_STREAM))
        p_d, q_d = p[draft], q_row[draft]
        if bool(((u * q_d <= p_d) & (p_d > 0)).item()):
            return True, None
        return False, sample(residual_distribution(p, q_row), position_key(seed, position, RESIDUAL_STREAM))
    if rule == ARGMAX_AGAINST_ARGMAX:
        choice = int(argmax_last(chain.adjusted_logits(row, history, (), allowed)).item())
    elif rule in (GREEDY_ARGMAX, SAMPLER_MATCH, SAMPLER_MATCH_NO_Q):
        choice = chain.select(row, history, (), seed, position, allowed)[0]
    else:
        raise ValueError(f"unknown acceptance rule {rule!r}")
    return (draft is not None and choice == draft), choice


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
