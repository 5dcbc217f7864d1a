"""One engine step (engine.decode.step.run_step) on a tiny real checkpoint: rows of every kind (a prompt
chunk, a prompt's last chunk, a decoding row, verify blocks that accept and reject, a constrained
row) in one step, each outcome equal, zero tolerance, to the same row stepped alone; every backend
(the ragged batch, mlx-lm's batch cache, a row's own cache); a verify row's rejected tail dropped
from its cache and its drafter told; a row whose own work fails fails alone."""

from __future__ import annotations

import random
from dataclasses import replace

import mlx.core as mx
import pytest
import tiny_gguf
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.cache.batch import DecodeBatch
from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.cache.ragged import RaggedBatch
from mlxcel.engine.decode.step import BatchCacheRows, OwnCaches, RaggedRows, Row, Sampling, Verify, run_step
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import GBNF, compile_grammar
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, new_matcher
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.session import SpeculativeSession

pytestmark = pytest.mark.mlx_native  # also run under MLXCEL_KERNELS=mlx (make test)

rng = random.Random(3)
CONTEXTS = [[rng.randrange(1, 300) for _ in range(n)] for n in (6, 11, 8, 5, 9)]
GREEDY = SamplerParams(temperature=0.0)
SAMPLED = SamplerParams(temperature=0.9)


@pytest.fixture(scope="module")
def q8(tiny_llama_dir, checkpoints_root):
    # packed CPU kernels: a row rounds the same in any batch, so "alone" and "together" must agree exactly
    return load_model(tiny_gguf.write_gguf(tiny_llama_dir, checkpoints_root / "step-q8.gguf",
                                           tiny_gguf.uniform(Q.Q8_0)))


class Scripted(Drafter):
    kind = "scripted"
    deterministic = True

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.observed = []

    def start(self, prompt, params, seed):
        pass

    def propose(self, sequence, k):
        return Proposal(self.tokens[:k])

    def observe(self, sequence, proposal, accepted):
        self.observed.append((list(sequence), accepted))


def chain(lm, params):
    return SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids, tokenizer=lm.tokenizer)


def greedy_next(lm, tokens, n):
    out = list(tokens)
    for _ in range(n):
        out.append(int(lm.model(mx.array([out]))[0, -1].argmax().item()))
    return out[len(tokens):]


def prefilled(lm, tokens):
    cache = lm.make_cache()
    if tokens:
        lm.model(mx.array([tokens]), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def verify_row(lm, key, context, params, *, wrong_at=None, seed=0):
    """A verify row after ``context`` (its last token pending): greedy drafts, one made wrong."""
    drafts = greedy_next(lm, context, 4)
    if wrong_at is not None:
        drafts[wrong_at] = (drafts[wrong_at] + 5) % lm.vocab_size
    drafter = Scripted(drafts)
    session = SpeculativeSession(drafter, params, n_max=4)
    session.begin(context, seed)
    prep = session.prepare(context, remaining=100)
    return Row(key, prep.block, verify=Verify(session, chain(lm, params), list(context), prep)), drafter


def rows_of(lm):
    """(key, the context its cache holds, the row) for a mixed step."""
    grammar = compile_grammar(GBNF, 'root ::= "zq"')
    matcher = new_matcher(grammar, lm.tokenizer, lm.vocab_size, lm.eos_token_ids)
    c = CONTEXTS
    out = [
        (0, c[0][:3], Row(0, c[0][3:5])),  # a chunk inside a prompt: no logits, nothing drawn
        (1, c[1][:6], Row(1, c[1][6:], sampling=Sampling(chain(lm, SAMPLED), c[1], seed=7))),  # a prompt's end
        (2, c[2][:-1], Row(2, c[2][-1:], sampling=Sampling(chain(lm, GREEDY), c[2], seed=1))),  # decoding
        (5, c[2][:-1], Row(5, c[2][-1:], sampling=Sampling(chain(lm, SAMPLED), c[2], seed=3, grammar=matcher))),
        (6, c[2][:-1], Row(6, c[2][-1:], sampling=Sampling(chain(lm, SAMPLED), c[2], seed=3, forced=42))),
    ]
    for key, context, kw in ((3, c[3], {}), (4, c[4], {"wrong_at": 1}), (7, c[4], {"wrong_at": 0})):
        row, _ = verify_row(lm, key, context, GREEDY, **kw)
        out.append((key, context[:-1], row))
    return out


def summary(outcome):
    r = outcome.round
    return (outcome.token, None if r is None else (r.emitted, r.accepted, r.tested, r.proposed),
            None if outcome.logits is None else outcome.logits.tolist(), outcome.error)


def ragged_step(lm, entries):
    batch = RaggedBatch(lm.model)
    for key, context, _ in entries:
        batch.add(key, prefilled(lm, context))
    outcomes = run_step(RaggedRows(batch), [row for _, _, row in entries])
    return outcomes, batch


def fresh(lm):
    """The same rows, built again (sessions and matchers are stateful)."""
    return rows_of(lm)


def test_every_row_of_a_ragged_step_gets_what_it_gets_alone(q8):
    together, batch = ragged_step(q8, fresh(q8))
    alone = [ragged_step(q8, [entry])[0][0] for entry in fresh(q8)]
    assert [summary(o) for o in together] == [summary(o) for o in alone]
    by_key = {o.key: o for o in together}
    # each sampled row's token is SamplerChain.select's on its logits row, its grammar's mask applied
    for key, _, row in fresh(q8):
        s = row.sampling
        if s is None or s.forced is not None:
            continue
        allowed = allowed_rows(s.grammar.masks(), q8.vocab_size) if s.grammar is not None else None
        logits = by_key[key].logits[-1:]
        assert by_key[key].token == s.chain.select(logits, s.history, (), s.seed, len(s.history), allowed)[0]
    assert by_key[0].token is None and by_key[0].logits is None  # inside a prompt: nothing kept
    assert by_key[6].token == 42  # a forced token is not drawn
    rounds = {k: by_key[k].round for k in (3, 4, 7)}
    assert rounds[3].accepted == 4 and rounds[4].accepted == 1 and rounds[7].accepted == 0
    # each verify row's cache keeps the pending token and its accepted drafts, no more
    for key, context in ((3, CONTEXTS[3]), (4, CONTEXTS[4]), (7, CONTEXTS[4])):
        assert batch.length(key) == len(context) + rounds[key].accepted


def test_a_verify_rows_drafter_is_told_what_the_round_emitted(q8):
    row, drafter = verify_row(q8, 0, CONTEXTS[4], GREEDY, wrong_at=2)
    (out,), _ = ragged_step(q8, [(0, CONTEXTS[4][:-1], row)])
    assert out.round.accepted == 2
    assert drafter.observed == [([*CONTEXTS[4], *out.round.emitted], 2)]


def test_the_batch_cache_and_own_caches_give_the_ragged_steps_tokens(q8):
    entries = [e for e in fresh(q8) if e[0] in (2, 5, 6)]
    ragged = [summary(o)[0] for o in ragged_step(q8, entries)[0]]
    batch = DecodeBatch(q8.model)
    for key, context, _ in fresh(q8):
        if key in (2, 5, 6):
            batch.add(key, prefilled(q8, context))
    in_batch = run_step(BatchCacheRows(batch), [row for key, _, row in fresh(q8) if key in (2, 5, 6)])
    assert [o.token for o in in_batch] == ragged
    caches = {key: prefilled(q8, context) for key, context, _ in fresh(q8) if key in (0, 1)}
    own = run_step(OwnCaches(q8.model, caches), [row for key, _, row in fresh(q8) if key in (0, 1)])
    assert own[1].token == summary(ragged_step(q8, [fresh(q8)[1]])[0][0])[0]
    assert cache_length(caches[0]) == 5 and cache_length(caches[1]) == len(CONTEXTS[1])


def test_a_row_whose_own_work_fails_fails_alone(q8):
    entries = fresh(q8)
    key, context, row = entries[3]
    broken = replace(row, sampling=replace(row.sampling, chain=None))  # its draw cannot be built
    entries[3] = (key, context, broken)
    together, _ = ragged_step(q8, entries)
    assert isinstance(together[3].error, Exception) and together[3].token is None
    expected = [summary(o) for o in ragged_step(q8, fresh(q8))[0]]
    got = [summary(o) for o in together]
    assert got[:3] + got[4:] == expected[:3] + expected[4:]


def test_a_failed_forward_raises(q8):
    entries = fresh(q8)[:2]
    batch = RaggedBatch(q8.model)
    batch.add(entries[0][0], prefilled(q8, entries[0][1]))  # row 1 is not in the batch
    with pytest.raises(Exception):
        run_step(RaggedRows(batch), [row for _, _, row in entries])
