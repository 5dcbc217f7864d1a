"""Synthetic pieces for the statistical tests of the acceptance rules.

``FixedLogitsModel`` answers every position with the same logits whatever the tokens, so under
any lossless rule the emitted stream is i.i.d. from one known categorical p: exactly what a
chi-square goodness-of-fit test can check. It only stands in for the *target network*; the
sampler chain, the rules and ``verify_round`` that run around it are the real ones.
``FixedProposalDrafter`` draws its blocks i.i.d. from a known q and reports q.
"""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal

# 12 000 emitted tokens by default; MLXCEL_SPEC_DIST_SAMPLES overrides.
DIST_SAMPLES = int(os.environ.get("MLXCEL_SPEC_DIST_SAMPLES", "12000"))
DOF = 5  # six outcomes
CHI2_CRITICAL = 25.7448  # chi-square(5) upper quantile at alpha = 1e-4

# A target p and a proposal q over six tokens that disagree a lot (sum min(p, q) ~ 0.55).
TARGET_LOGITS = np.log(np.array([0.32, 0.24, 0.18, 0.12, 0.09, 0.05]))
PROPOSAL_Q = np.array([0.05, 0.10, 0.15, 0.20, 0.20, 0.30])


def target_p() -> np.ndarray:
    e = np.exp(TARGET_LOGITS - TARGET_LOGITS.max())
    return e / e.sum()


class PositionCache:
    """Just an offset, advanced by the fake model and trimmed by ``kv_cache.rewind``."""

    def __init__(self):
        self.offset = 0

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n

    @property
    def state(self):
        return []


class FixedLogitsModel:
    def __init__(self, logits):
        self.logits = mx.array(np.asarray(logits, dtype=np.float32))

    def __call__(self, tokens: mx.array, cache=None) -> mx.array:
        b, length = tokens.shape
        for c in cache or []:
            c.offset += length
        return mx.broadcast_to(self.logits, (b, length, self.logits.shape[-1]))


class FixedProposalDrafter(Drafter):
    kind = "fixed-proposal"
    provides_distribution = True
    deterministic = False

    def __init__(self, q, seed: int = 0):
        self.q = np.asarray(q, dtype=np.float64)
        self.q_rows = mx.array(self.q.astype(np.float32))
        self.rng = np.random.default_rng(seed)

    def start(self, sequence, params, seed) -> None:
        pass

    def propose(self, sequence, k: int) -> Proposal:
        tokens = self.rng.choice(len(self.q), size=k, p=self.q).tolist()
        return Proposal(tokens, mx.broadcast_to(self.q_rows, (k, len(self.q))))

    def observe(self, sequence, proposal, accepted) -> None:
        pass

    def counters_line(self):
        return None


def chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = counts.sum() * p
    return float(((counts - expected) ** 2 / expected).sum())
