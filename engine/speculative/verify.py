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
   gated-delta, LFM2 convolutions, ...) are cut back with the ``cache.recurrent.StateTape`` the
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
from typing import Any

import mlx.core as mx

from mlxcel.engine.cache.kv_cache import rewind
from mlxcel.engine.cache.recurrent import StateTape
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, allowed_rows
from mlxcel.engine.speculative.acceptance import ChainOutcome
from mlxcel.engine.speculative.block import PreparedRound, RoundResult, prepare_round, round_result
from mlxcel.engine.speculative.decide import DecideRow, decide_one
from mlxcel.engine.speculative.drafter import Drafter, ModelDrafter
from mlxcel.engine.speculative.exactness_probe import block_verdict
from mlxcel.engine.speculative.target_features import TargetFeatures, forward_with_features


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
    layers = tuple(model_drafter.feature_layers) if model_drafter is not None else None
    row = DecideRow(prep, None, chain, drafter, sequence, rule=rule, seed=seed, diagnostics=diagnostics,
                    synth_probs=synth_probs, grammar=grammar)
    if block_exact is None:
        block_exact = True
        if prep.drafts and model_drafter is not None and model_drafter.probe_gated:
            # every width this drafter may verify at must clear the probe (ModelDrafter.probe_widths)
            widths = sorted({len(prep.block), *model_drafter.probe_widths(k)})
            block_exact = all(block_verdict(model, w, vocab_size=chain.vocab_size).exact for w in widths)

    tape = None
    if block_exact or not prep.drafts:
        # a cache with recurrent layers records what it needs to be cut back to the kept prefix
        tape = StateTape.for_cache(model, cache) if prep.drafts else None
        with tape.recording() if tape is not None else nullcontext():
            features = forward_block(model, prep.block, cache, layers)
        row.logits = features.logits
        if grammar is not None:
            mx.async_eval(row.logits)  # the masks are computed while the forward runs
        result = decide_one(row)
        forwarded = len(prep.block)
    else:
        result, features = _chain_verify(model, cache, row, layers)
        forwarded = features.length

    kept = result.accepted + 1  # the pending token and the accepted drafts
    rewind(cache, forwarded - kept, tape)
    if model_drafter is not None:
        result.kept_features = features.rows(0, kept)
        model_drafter.observe_target(result.kept_features)
    drafter.observe([*sequence, *result.emitted], prep.proposal, result.accepted)
    return result


def forward_block(model: Any, tokens: list[int], cache: list[Any], layers: tuple[int, ...] | None) -> TargetFeatures:
    """The target's forward over ``tokens`` on one sequence's ``cache``: every position's logits, and
    the hidden states of ``layers`` when a model drafter reads them."""
    if layers is None:
        return TargetFeatures(model(mx.array([tokens]), cache=cache)[0])
    return forward_with_features(model, tokens, cache, layers)


def _chain_verify(model: Any, cache: list[Any], row: DecideRow, layers) -> tuple[RoundResult, TargetFeatures]:
    """Score ``row``'s block one forward per token (what plain decoding computes, bit for bit),
    deciding each draft as soon as its row exists and stopping at the first rejection, so nothing
    past the emitted sequence is ever forwarded (no rewind; this works on any cache, a wrapped
    sliding window included). Each decision is ``decide.decide_rounds``'s on that one row: the
    history as the block path gives it (the drafts before it appended), the same position key, the
    same mask row; the draft's row without a bonus position, the last row with it. Returns the
    round's result and the features of the rows forwarded."""
    prep, sequence = row.prep, [int(t) for t in row.sequence]
    drafts = prep.drafts
    vocab = row.chain.vocab_size
    allowed = allowed_rows(row.grammar.masks(drafts), vocab) if row.grammar is not None else None
    parts: list[TargetFeatures] = []
    outcome = None
    for i, token in enumerate(prep.block):
        part = forward_block(model, [token], cache, layers)
        parts.append(part)
        testing = i < len(drafts)
        one = PreparedRound(prep.proposal, drafts[i:i + 1], drafts[i:i + 1],
                            prep.q[i:i + 1] if testing and prep.q is not None else None,
                            None if testing else prep.forbidden_q, [token, *drafts[i:i + 1]], prep.position + i)
        verdict = decide_one(DecideRow(one, part.logits, row.chain, row.drafter, sequence + drafts[:i],
                                       rule=row.rule, seed=row.seed, synth_probs=row.synth_probs[i:],
                                       bonus=not testing,
                                       allowed=None if allowed is None else allowed[i:i + 1]))
        if testing and verdict.accepted:
            continue
        emit = verdict.emitted[-1]
        outcome = ChainOutcome(i, [*drafts[:i], int(emit)], min(i + 1, len(drafts)) if testing else i)
        break
    features = TargetFeatures.join(parts)
    result = round_result(prep, outcome, None, features.logits, allowed, row.rule, row.chain, row.drafter,
                          row.sequence, row.seed, row.diagnostics, chain_verified=True)
    return result, features
