"""The acceptance decision (decide.decide_rounds, the one implementation every verify round runs)
against a reference written here from the rules' definitions (``SamplerChain.select`` /
``distribution`` per block, the accept test and residual draw row by row, host-side walks), and many
rows decided together against each decided alone, on a tiny real checkpoint's block logits: every
acceptance rule, greedy and sampled chains, penalties, drafts the target accepts and rejects,
grammar-constrained rows with a cut draft, mixed in one batch. Zero tolerance."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.platform.argmax import argmax_last
from mlxcel.engine.sampling import batch_select
from mlxcel.engine.sampling.chain import SamplerChain, sample
from mlxcel.engine.sampling.grammar import GBNF, compile_grammar
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, new_matcher
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.speculative.acceptance import (
    ACCEPT_STREAM,
    ARGMAX_AGAINST_ARGMAX,
    GREEDY_ARGMAX,
    RESIDUAL_STREAM,
    SAMPLER_MATCH,
    SAMPLER_MATCH_NO_Q,
    STOCHASTIC,
    SYNTH_STREAM,
    SYNTHETIC,
    ChainOutcome,
    residual_distribution,
    walk_chain,
)
from mlxcel.engine.speculative.block import align_q, prepare_round, round_result
from mlxcel.engine.speculative.decide import DecideRow, decide_one, decide_rounds
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

BASE = SamplerParams()
GREEDY = replace(BASE, temperature=0.0)
TEXTS = ["the quick brown fox jumps", "a b c a b c a", "jumps over the lazy dog and the", "hello there hello"]
WORDS = 'root ::= ("the" | "fox" | "dog") (" " ("the" | "fox" | "dog")){2,8} "."'


class Scripted(Drafter):
    """Proposes what it is given (with its q rows when given)."""

    kind = "scripted"

    def __init__(self, tokens, q=None, deterministic=False):
        self.tokens, self.q = list(tokens), q
        self.deterministic = deterministic
        self.observed = []

    def start(self, prompt, params, seed):
        pass

    def propose(self, sequence, k):
        return Proposal(self.tokens[:k], None if self.q is None else self.q[:k])

    def observe(self, sequence, proposal, accepted):
        self.observed.append((list(sequence), accepted))


def greedy_continuation(lm, tokens, n):
    out = list(tokens)
    for _ in range(n):
        out.append(int(lm.model(mx.array([out]))[0, -1].argmax().item()))
    return out[len(tokens):]


def block_logits(lm, sequence, drafts):
    """The target's rows for ``[pending, *drafts]``: row i predicts position len(sequence) + i."""
    return lm.model(mx.array([list(sequence) + list(drafts)]))[0, len(sequence) - 1:].astype(mx.float32)


def make_row(lm, text, rule, params, *, seed, wrong_at=None, k=4, q=False, grammar=None, synth=(), diag=False,
             extra=()):
    sequence = lm.tokenizer.encode(text)
    drafts = greedy_continuation(lm, sequence, k) + list(extra)
    if wrong_at is not None and wrong_at < len(drafts):
        drafts[wrong_at] = (drafts[wrong_at] + 7) % lm.vocab_size
    q_rows = None
    if q == "draft":  # q mostly on the drafts: the accept test u * q(d) <= p(d) rejects often
        q_rows = 0.1 / lm.vocab_size + 0.9 * (mx.arange(lm.vocab_size)[None] == mx.array(drafts)[:, None])
    elif q:
        rng = np.random.default_rng(seed)
        q_rows = mx.softmax(mx.array(rng.normal(size=(len(drafts), lm.vocab_size)).astype(np.float32) * 2), axis=-1)
    drafter = Scripted(drafts, q_rows)
    prep = prepare_round(drafter, sequence, len(drafts), grammar)
    chain = SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids, tokenizer=lm.tokenizer)
    logits = block_logits(lm, sequence, prep.drafts)
    mx.eval(logits)
    return DecideRow(prep, logits, chain, drafter, sequence, rule=rule, seed=seed, diagnostics=diag,
                     synth_probs=synth, grammar=grammar)


def alone(row: DecideRow):
    """The row decided as a batch of one."""
    return decide_one(row)


def reference(row: DecideRow):
    """The rules as their definitions state them, one row, reading back as it goes."""
    prep, chain, seq, seed, pos = row.prep, row.chain, row.sequence, row.seed, row.prep.position
    drafts, vocab = prep.drafts, row.logits.shape[-1]
    allowed = allowed_rows(row.grammar.masks(drafts), vocab) if row.grammar is not None else None
    p = None
    if row.rule == STOCHASTIC:
        p = chain.distribution(row.logits, seq, drafts, seed, pos, allowed)
        outcome = None
        for i, d in enumerate(drafts):
            q = align_q(prep.q, vocab)[i]
            u = mx.random.uniform(key=position_key(seed, pos + i, ACCEPT_STREAM))
            if not bool(((u * q[d] <= p[i, d]) & (p[i, d] > 0)).item()):
                token = sample(residual_distribution(p[i], q), position_key(seed, pos + i, RESIDUAL_STREAM))
                outcome = ChainOutcome(i, [*drafts[:i], token], i + 1)
                break
        if outcome is None:
            k = len(drafts)
            if prep.forbidden_q is not None:
                cut = align_q(prep.forbidden_q[None], vocab)[0]
                token = sample(residual_distribution(p[k], cut), position_key(seed, pos + k, RESIDUAL_STREAM))
                outcome = ChainOutcome(k, [*drafts, token], k + 1)
            else:
                outcome = ChainOutcome(k, [*drafts, sample(p[k], position_key(seed, pos + k))], k)
    elif row.rule == ARGMAX_AGAINST_ARGMAX:
        outcome = walk_chain(argmax_last(chain.adjusted_logits(row.logits, seq, drafts, allowed)).tolist(), drafts)
    elif row.rule == SYNTHETIC:
        choices = chain.select(row.logits, seq, drafts, seed, pos, allowed)
        n = 0
        while n < len(drafts):
            u = float(mx.random.uniform(key=position_key(seed, pos + n, SYNTH_STREAM)).item())
            if u >= row.synth_probs[n] or drafts[n] in chain.eos_token_ids:
                break
            n += 1
        outcome = ChainOutcome(n, [*drafts[:n], int(choices[n])], n + 1 if n < len(drafts) else n)
    else:
        outcome = walk_chain(chain.select(row.logits, seq, drafts, seed, pos, allowed), drafts)
    return round_result(prep, outcome, p, row.logits, allowed, row.rule, chain, row.drafter, seq, seed,
                        row.diagnostics)


def summary(r):
    return (r.emitted, r.proposed, r.accepted, r.tested, r.grammar_cut, r.diagnosed, r.sum_min, r.sum_prod)


def mixed_rows(lm, seed0):
    rows = []
    for n, text in enumerate(TEXTS):
        s = seed0 + 31 * n
        rows += [
            make_row(lm, text, GREEDY_ARGMAX, GREEDY, seed=s, wrong_at=n),
            make_row(lm, text, GREEDY_ARGMAX, replace(GREEDY, repeat_penalty=1.4, repeat_last_n=16), seed=s),
            make_row(lm, text, SAMPLER_MATCH, BASE, seed=s, wrong_at=None if n % 2 else 2),
            make_row(lm, text, SAMPLER_MATCH, replace(BASE, temperature=0.2), seed=s + 1),
            make_row(lm, text, SAMPLER_MATCH, replace(BASE, top_k=0, top_p=0.7, min_p=0.0, temperature=1.3), seed=s),
            make_row(lm, text, SAMPLER_MATCH, replace(BASE, presence_penalty=0.5, frequency_penalty=0.3,
                                                      dry_multiplier=0.8), seed=s, diag=True),
            make_row(lm, text, SAMPLER_MATCH_NO_Q, replace(BASE, typical_p=0.8, xtc_probability=0.5,
                                                           xtc_threshold=0.05), seed=s),
            make_row(lm, text, ARGMAX_AGAINST_ARGMAX, BASE, seed=s, wrong_at=n + 1),
            make_row(lm, text, STOCHASTIC, BASE, seed=s, q=True, diag=n == 0),
            make_row(lm, text, STOCHASTIC, replace(BASE, top_k=0, top_p=1.0, min_p=0.0, temperature=0.9), seed=s + 2,
                     q=True),
            make_row(lm, text, STOCHASTIC, BASE, seed=s, q=True, k=0),
            make_row(lm, text, STOCHASTIC, replace(BASE, temperature=1.2), seed=s + 3, q="draft", wrong_at=3),
            make_row(lm, text, STOCHASTIC, replace(BASE, top_k=0, top_p=1.0, min_p=0.0), seed=s + 4, q="draft"),
            make_row(lm, text, SYNTHETIC, BASE, seed=s, synth=(0.9, 0.7, 0.5, 0.3) if n % 2 else (1.0, 1.0, 0.99, 0.99)),
        ]
    return rows


@pytest.mark.parametrize("seed0", [0, 7, 4242])
def test_every_row_decides_what_it_decides_alone(tiny_llama, seed0):
    rows = mixed_rows(tiny_llama, seed0)
    together = decide_rounds(rows)
    assert not any(isinstance(r, Exception) for r in together)
    expected = [summary(reference(r)) for r in rows]
    assert [summary(r) for r in together] == expected
    assert [summary(alone(r)) for r in rows] == expected
    assert [summary(r) for r in decide_rounds(rows[::-1])] == expected[::-1]
    # the batch sees acceptances and rejections both, under every rule
    for rule in (GREEDY_ARGMAX, SAMPLER_MATCH, STOCHASTIC, SYNTHETIC):
        ours = [r for r, row in zip(together, rows) if row.rule == rule and r.proposed]
        assert any(r.accepted == r.proposed for r in ours) and any(r.accepted < r.proposed for r in ours), rule


@pytest.mark.parametrize("rule,params", [(GREEDY_ARGMAX, GREEDY), (SAMPLER_MATCH, BASE), (STOCHASTIC, BASE),
                                         (ARGMAX_AGAINST_ARGMAX, BASE)])
def test_grammar_constrained_rows_with_a_cut_draft(tiny_llama, rule, params):
    grammar = compile_grammar(GBNF, WORDS)
    lm = tiny_llama
    rows = []
    for n, text in enumerate(("the fox the", "the dog", "fox fox dog the")):
        matcher = new_matcher(grammar, lm.tokenizer, lm.vocab_size, lm.eos_token_ids)
        inside = lm.tokenizer.encode(" the dog fox")
        sequence = lm.tokenizer.encode(text)
        matcher.advance(sequence)
        forbidden = lm.tokenizer.encode("zq")[:1]
        drafts = inside[: n + 1] + forbidden + inside[:2]
        rng = np.random.default_rng(n)
        q = mx.softmax(mx.array(rng.normal(size=(len(drafts), lm.vocab_size)).astype(np.float32)), axis=-1)
        row_params = params
        if rule == STOCHASTIC and n > 0:
            # q away from the drafts and p over the whole vocabulary: every allowed draft is accepted, so
            # the round sweeps up to the cut and draws the cut draft's residual
            q = mx.zeros((len(drafts), lm.vocab_size)).at[:, 0].add(1.0)
            row_params = replace(params, top_k=0, top_p=1.0, min_p=0.0)
        drafter = Scripted(drafts, q)
        prep = prepare_round(drafter, sequence, len(drafts), matcher)
        assert prep.cut > 0
        chain = SamplerChain(row_params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
        logits = block_logits(lm, sequence, prep.drafts)
        rows.append(DecideRow(prep, logits, chain, drafter, sequence, rule=rule, seed=n, grammar=matcher))
    rows += mixed_rows(lm, 3)[:6]
    together = decide_rounds(rows)
    assert [summary(r) for r in together] == [summary(reference(r)) for r in rows]
    assert all(r.grammar_cut > 0 for r in together[:3])
    if rule == STOCHASTIC:
        assert all(r.accepted == len(row.prep.drafts) for r, row in zip(together[1:3], rows[1:3]))


def test_one_readback_for_every_row(tiny_llama, monkeypatch):
    rows = mixed_rows(tiny_llama, 11)
    reads = []
    real = batch_select._read
    monkeypatch.setattr(batch_select, "_read", lambda arrays: reads.append(len(arrays)) or real(arrays))
    for r in rows:
        r.diagnostics = False  # the diagnostic closed forms read back on their own
    decide_rounds(rows)
    assert len(reads) == 1 and reads[0] >= len(rows)


def test_a_row_that_fails_fails_alone(tiny_llama, monkeypatch):
    rows = mixed_rows(tiny_llama, 5)[:12]
    expected = [summary(alone(r)) for r in rows]
    broken = replace(rows[8], prep=replace(rows[8].prep, q=None))  # the stochastic rule without q
    got = decide_rounds(rows[:8] + [broken] + rows[9:])
    assert isinstance(got[8], ValueError)
    assert [summary(r) for i, r in enumerate(got) if i != 8] == expected[:8] + expected[9:]
    real = batch_select._read
    monkeypatch.setattr(batch_select, "_read",
                        lambda arrays: (_ for _ in ()).throw(RuntimeError("boom")) if len(arrays) > 2 else real(arrays))
    assert [summary(r) for r in decide_rounds(rows)] == expected
