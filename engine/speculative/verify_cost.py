"""What a shared verify forward costs on this machine, and so how many drafts a row may bring to it.

The rows of an engine iteration share one ragged verify forward (``engine.decode.ragged``). Its cost
is modelled as ``fixed_ms + per_token_ms * N`` for ``N`` tokens in the forward (the rows' pending
tokens plus their drafts): the fixed part is what a forward pays whatever it carries (reading the
weights, launching the layers), the per-token part what each token adds. On this 2-core CPU the
forward is compute-bound, about 25 ms + 6.4 ms a token for SmolLM2; on Metal and CUDA the fixed
part dominates, so extra drafts are nearly free there.

A draft at position ``j`` of a row's block costs one more token in the forward, ``per_token_ms``
that every row in the iteration waits for, and yields a token only when drafts ``1 .. j`` are all
accepted: with a per-draft acceptance ``a`` (the chance a draft is accepted given the ones before
it were), ``a ** j``. A plain step of ``B`` rows yields ``B`` tokens for ``fixed_ms + B *
per_token_ms``, i.e. one token per ``per_token_ms + fixed_ms / B`` ms. So a row drafts position
``j`` only while ``a ** j`` exceeds ``per_token_ms / (per_token_ms + fixed_ms / B)``: at one row
the fixed cost is the row's alone and that bar is low; as the batch widens the fixed cost is
shared and the bar rises towards 1 (:meth:`VerifyCost.draft_cap`). The bar compares a draft with a
plain step's rate, not with the (higher) rate of drafting rows, so it errs towards drafting.

The cap changes only how many drafts a row proposes, never which tokens are emitted: every rule
decides on the target's logits of the positions it forwards, which do not depend on the block's
length or on the other rows (``ragged``'s exactness note). One client (``B = 1``) keeps the
session's own ``n_max``, so the single-client case is exactly as before.

Where the model comes from: measured once at load (:func:`measure`: the ragged forward timed at
three widths, least squares), because it is a property of the model *and* the machine (a device
default would be wrong for every other model), and cheap to take (well under a second for
SmolLM2 here). ``MLXCEL_VERIFY_COST=FIXED_MS,PER_TOKEN_MS`` gives it instead, for tests (timings
on shared cores are noise) and for reproducible benchmarks; ``MLXCEL_VERIFY_COST=off`` turns the
cap off (every row drafts up to its ``n_max``, as before this module).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxcel.engine.decode.batch import forward_chunk
from mlxcel.engine.decode.ragged import RaggedBatch, StepPlan, joinable
from mlxcel.engine.errors import MlxcelError

COST_ENV = "MLXCEL_VERIFY_COST"
_MEASURE_ROWS = 2
_MEASURE_WIDTHS = (1, 8, 16)  # tokens per row in the timed forwards
_MEASURE_CONTEXT = 32  # tokens each timed row holds
_MEASURE_REPEATS = 2  # best of, after one warm-up
PRIOR_ACCEPTED, PRIOR_TESTED = 4, 5  # a row's acceptance before its own evidence: 0.8 (VerifyCost.draft_cap)


@dataclass(frozen=True)
class VerifyCost:
    """A shared verify forward of ``N`` tokens costs ``fixed_ms + per_token_ms * N``."""

    fixed_ms: float
    per_token_ms: float
    source: str = "given"  # "measured" or "given" (the environment)

    def bar(self, rows: int) -> float:
        """The acceptance chance a draft must beat to pay for its token when ``rows`` rows share the forward."""
        if self.per_token_ms <= 0:
            return 0.0
        return self.per_token_ms / (self.per_token_ms + self.fixed_ms / max(1, rows))

    def draft_cap(self, rows: int, accepted: int, tested: int, n_max: int, n_min: int = 0) -> int:
        """The most drafts a row may propose this iteration when ``rows`` rows share the forward and
        the row has had ``accepted`` of ``tested`` drafted positions accepted so far.

        ``n_max`` at one row. Otherwise the last position ``j <= n_max`` whose ``a ** j`` still
        beats :meth:`bar`, with ``a`` the row's per-draft acceptance estimated with a prior of
        :data:`PRIOR_ACCEPTED` accepted of :data:`PRIOR_TESTED` positions, ``(accepted + 4) /
        (tested + 5)``: a row with no evidence starts at 0.8, about what edit-style lookups are
        accepted at, so a fresh row drafts enough to show what it is worth (a pessimistic start,
        Laplace's one half, capped fresh rows at 2 drafts, under the lookup governor's break-even
        of 4 tokens a round, and the governor paused them before they had shown anything); its own
        positions outweigh the prior after a few rounds, and no evidence makes a draft certain.
        Never below ``n_min`` (the row's floor: a block shorter than it is not verified at all),
        nor below 1: a capped row keeps drafting one position, so its acceptance keeps being
        measured and its cap can grow back."""
        if n_max <= 0:
            return 0
        if rows <= 1:
            return n_max
        a = (accepted + PRIOR_ACCEPTED) / (tested + PRIOR_TESTED)
        bar = self.bar(rows)
        k = 0
        while k < n_max and a ** (k + 1) > bar:
            k += 1
        return min(n_max, max(k, n_min, 1))

    def describe(self) -> str:
        return f"{self.fixed_ms:.1f} ms + {self.per_token_ms:.2f} ms a token ({self.source})"


def from_env(environ: Mapping[str, str] | None = None) -> VerifyCost | None | str:
    """``MLXCEL_VERIFY_COST``: a :class:`VerifyCost` when it gives one, ``"off"`` when it turns the cap
    off, None when unset (measure)."""
    env = os.environ if environ is None else environ
    text = env.get(COST_ENV, "").strip().lower()
    if not text:
        return None
    if text in ("off", "0", "none", "no"):
        return "off"
    try:
        fixed, per_token = (float(x) for x in text.split(","))
    except ValueError:
        raise MlxcelError(f"{COST_ENV}={text!r}: expected FIXED_MS,PER_TOKEN_MS (e.g. 25,6.4) or off") from None
    if not (math.isfinite(fixed) and math.isfinite(per_token)) or fixed < 0 or per_token < 0:
        raise MlxcelError(f"{COST_ENV}={text!r}: both costs must be finite and >= 0")
    return VerifyCost(fixed, per_token, source="given")


def measure(model: Any, make_cache: Callable[[], list[Any]], vocab_size: int) -> VerifyCost | None:
    """Time the ragged forward at a few widths on ``model`` and fit ``fixed + per_token * N``; None
    when the target's cache cannot join a ragged batch (its rows are then never verified together)."""
    cache = make_cache()
    if not joinable(cache):
        return None
    tokens = [(7 * i + 3) % max(2, vocab_size) for i in range(_MEASURE_CONTEXT + max(_MEASURE_WIDTHS))]
    forward_chunk(model, tokens[:_MEASURE_CONTEXT], cache)
    batch = RaggedBatch(model)
    for row in range(_MEASURE_ROWS):
        batch.add(row, cache)
    points = []
    for width in _MEASURE_WIDTHS:
        best = math.inf
        for repeat in range(_MEASURE_REPEATS + 1):  # the first is a warm-up (graph and buffer setup)
            plan = StepPlan()
            for row in batch.rows:
                plan.add(row, tokens[_MEASURE_CONTEXT:_MEASURE_CONTEXT + width], batch.length(row))
            start = time.perf_counter()
            mx.eval(batch.forward(plan))
            elapsed = (time.perf_counter() - start) * 1e3
            for row in batch.rows:
                batch.rewind(row, width)
            if repeat:
                best = min(best, elapsed)
        points.append((_MEASURE_ROWS * width, best))
    n_mean = sum(n for n, _ in points) / len(points)
    t_mean = sum(t for _, t in points) / len(points)
    slope = (sum((n - n_mean) * (t - t_mean) for n, t in points)
             / sum((n - n_mean) ** 2 for n, _ in points))
    per_token = max(0.0, slope)
    fixed = max(0.0, t_mean - per_token * n_mean)
    return VerifyCost(fixed, per_token, source="measured")


def load(model: Any, make_cache: Callable[[], list[Any]], vocab_size: int, *,
         may_measure: bool = True) -> VerifyCost | None:
    """The cost model a server runs with: the environment's, else measured (when ``may_measure``:
    ranks serving in lockstep must derive the same caps, so they never measure), else None (no cap)."""
    given = from_env()
    if given == "off":
        return None
    if given is not None:
        return given
    return measure(model, make_cache, vocab_size) if may_measure else None
