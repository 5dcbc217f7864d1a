"""Under a grammar, constrained speculative sampling is distributed as constrained target sampling.

The target is a fixed categorical over six tokens a..f (``spec_fixtures``), the grammar the regex
``([abc][def])*``, so the constrained p at an even position is p renormalised over {a, b, c} and at
an odd one over {d, e, f}: the emitted stream has a known distribution, position class by position
class. The real ``verify_round``, sampler chain, rules and llguidance matcher run in between, with a
drafter that proposes from a q very different from p, half of whose mass the grammar forbids, so
most rounds cut their proposal at a forbidden draft (the path that must draw the residual).

Chi-square over the six tokens, each against its class's expected count (two classes of three: dof
4), rejected above the alpha = 1e-4 quantile, as the project's other distribution tests. The power
checks run the same statistic at the same count on three wrong implementations: p left unmasked
(the grammar ignored by the verify round), a drafter that draws from its masked q but reports the
unmasked one, and a cut that emits a bonus from p instead of the cut draft's residual. Each must be
rejected (measured at 2 000 tokens: about 1-4 for the right ones, 67 for the bonus at the cut, 355
for the lying q). The default suite runs 2 000 tokens (``MLXCEL_SPEC_DIST_SAMPLES`` overrides), the
slow suite the spec's 12 000.
"""

from __future__ import annotations

import os

import llguidance
import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chi2
from spec_fixtures import PROPOSAL_Q, TARGET_LOGITS, FixedLogitsModel, PositionCache, target_p

from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import REGEX, compile_grammar
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, allowed_rows
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import decide, verify
from mlxcel.engine.speculative.acceptance import SAMPLER_MATCH, STOCHASTIC
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

SAMPLES = int(os.environ.get("MLXCEL_SPEC_DIST_SAMPLES", "2000"))
SLOW_SAMPLES = 12000
CRITICAL = float(chi2.isf(1e-4, 4))  # 23.51
EOS = 6
VOCAB = 7
CLASSES = (np.array([1, 1, 1, 0, 0, 0, 0], bool), np.array([0, 0, 0, 1, 1, 1, 0], bool))  # even, odd positions
PARAMS = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)


class Letters:
    """A byte tokenizer for llguidance: a..f and an end token."""

    tokens = [b"a", b"b", b"c", b"d", b"e", b"f", b"</s>"]
    eos_token_id = EOS
    bos_token_id = None
    special_token_ids = [EOS]

    def __call__(self, text):
        return [self.tokens.index(bytes([c])) for c in text]


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Letters()))
GRAMMAR = compile_grammar(REGEX, "([abc][def])*")
P = np.append(target_p(), 0.0)
Q = np.append(PROPOSAL_Q, 0.0)


def expected_rows() -> list[np.ndarray]:
    return [np.where(c, P, 0.0) / P[c].sum() for c in CLASSES]


class ProposalDrafter(Drafter):
    """Drafts i.i.d. from ``Q`` (``masked``: from Q renormalised over what the grammar allows at each
    drafted position, walking the matcher and rolling it back) and reports ``Q`` itself, its masked
    rows, or (``lie``) the unmasked Q for masked draws."""

    provides_distribution = True

    def __init__(self, seed: int, masked: bool = False, lie: bool = False):
        self.rng = np.random.default_rng(seed)
        self.masked, self.lie = masked, lie

    def start(self, prompt, params, seed):
        pass

    def propose(self, sequence, k):
        tokens, rows = [], []
        for _ in range(k):
            q = Q
            if self.masked:
                allowed = np.array(allowed_rows(self.grammar.masks(), VOCAB))[0]
                q = np.where(allowed, Q, 0.0) / Q[allowed].sum()
            t = int(self.rng.choice(VOCAB, p=q))
            tokens.append(t)
            rows.append(Q if self.lie or not self.masked else q)
            if self.masked:
                self.grammar.advance([t])
        if self.masked:
            self.grammar.rollback(len(tokens))
        return Proposal(tokens, mx.array(np.array(rows, dtype=np.float32)))

    def observe(self, sequence, proposal, accepted):
        pass


def stream(rule: str, n: int, *, seed: int = 1234, k: int = 4, masked: bool = False, lie: bool = False,
           unmasked_p: bool = False) -> list[int]:
    """``n`` emitted tokens from real verify rounds under the grammar (``unmasked_p``: the rounds are
    not told about it)."""
    model = FixedLogitsModel(np.append(TARGET_LOGITS, 0.0))
    cache = [PositionCache()]
    chain = SamplerChain(PARAMS, vocab_size=VOCAB, eos_token_ids=[EOS])
    grammar = GrammarMatcher(GRAMMAR, TOKENIZER)
    drafter = ProposalDrafter(seed, masked=masked, lie=lie)
    drafter.grammar = grammar
    sequence, out = [0], []
    while len(out) < n:
        r = verify.verify_round(model, cache, chain, drafter, sequence, rule=rule, k=k, seed=seed,
                                grammar=None if unmasked_p else grammar)
        if not unmasked_p:
            grammar.advance(r.emitted)
        sequence.extend(r.emitted)
        out.extend(r.emitted)
        assert cache[0].offset == len(sequence) - 1
    return out[:n]


def statistic(tokens: list[int]) -> float:
    """Chi-square of the six tokens, each against the count its position class predicts."""
    tokens = np.asarray(tokens)
    stat = 0.0
    for parity, row in enumerate(expected_rows()):
        seen = np.bincount(tokens[parity::2], minlength=VOCAB).astype(float)
        expected = seen.sum() * row
        cells = CLASSES[parity]
        stat += float(((seen[cells] - expected[cells]) ** 2 / expected[cells]).sum())
        stat += float(seen[~cells].sum()) * 1e6  # a token outside the grammar is never acceptable
    return stat


@pytest.mark.parametrize("rule,masked", [(SAMPLER_MATCH, False), (STOCHASTIC, False), (STOCHASTIC, True)],
                         ids=["sampler-match", "stochastic-unmasked-q", "stochastic-masked-q"])
def test_constrained_speculative_sampling_is_constrained_target_sampling(rule, masked):
    stat = statistic(stream(rule, SAMPLES, masked=masked))
    assert stat <= CRITICAL, f"{rule}: chi-square {stat:.2f} > {CRITICAL:.2f} over {SAMPLES} tokens"


@pytest.mark.slow
@pytest.mark.parametrize("rule,masked", [(SAMPLER_MATCH, False), (STOCHASTIC, False), (STOCHASTIC, True)],
                         ids=["sampler-match", "stochastic-unmasked-q", "stochastic-masked-q"])
def test_constrained_speculative_sampling_at_the_specs_sample_count(rule, masked):
    stat = statistic(stream(rule, SLOW_SAMPLES, masked=masked, seed=99))
    assert stat <= CRITICAL, f"{rule}: chi-square {stat:.2f} > {CRITICAL:.2f} over {SLOW_SAMPLES} tokens"


def test_the_statistic_rejects_wrong_constrained_implementations(monkeypatch):
    unmasked_p = statistic(stream(STOCHASTIC, SAMPLES, unmasked_p=True))
    assert unmasked_p > CRITICAL, f"an unmasked p was not rejected: {unmasked_p:.2f}"
    lying_q = statistic(stream(STOCHASTIC, SAMPLES, masked=True, lie=True))
    assert lying_q > CRITICAL, f"an unmasked q reported for masked draws was not rejected: {lying_q:.2f}"
    real = decide.rejection_candidates
    monkeypatch.setattr(decide, "rejection_candidates", lambda *a, forbidden_q=None, **kw: real(*a, **kw))
    bonus_at_cut = statistic(stream(STOCHASTIC, SAMPLES))
    assert bonus_at_cut > CRITICAL, f"a bonus from p at the cut was not rejected: {bonus_at_cut:.2f}"
