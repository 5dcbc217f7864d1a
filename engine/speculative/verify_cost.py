"""What a shared verify forward costs on this machine, and so how many drafts a row may bring to it.

The rows of an engine iteration share one ragged verify forward (``engine.cache.ragged``). Its cost
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

The cap changes how many drafts a row proposes; it changes which tokens are emitted only where the
target's logits of a position depend on the block's length or on the other rows, since every rule
decides on those logits. They do not on mlxcel's fused CPU ops (``ragged``'s exactness note); on
other backends (MLX's kernels on Metal and CUDA, float32 over OpenBLAS) the server checks both at
start-up, and where either fails it runs without a cost model (each row's cap is its request's
``n_max``, a constant) and verifies such rows alone (``server/runtime/invariance.py``), so that no
row's tokens follow the batch's width or the machine's timings. One client (``B = 1``) keeps the
session's own ``n_max``, so the single-client case is exactly as before.

Where the model comes from: measured once at load (:func:`measure`: the ragged forward timed at
three widths, least squares), because it is a property of the model *and* the machine (a device
default would be wrong for every other model), and cheap to take (well under a second for
SmolLM2 here). ``MLXCEL_VERIFY_COST=FIXED_MS,PER_TOKEN_MS`` gives it instead, for tests (timings
on shared cores are noise) and for reproducible benchmarks; ``MLXCEL_VERIFY_COST=off`` turns the
cap off (every row drafts up to its ``n_max``, as before this module).

Learned while serving (:class:`LearnedCost`, ``MLXCEL_VERIFY_COST=learn``; not the default: in a
quiet A/B of the concurrency mixes it did not beat the load-time model, docs/benchmarks.md). The load-time
measurement is a start, not an answer: it is two rows at a context of 32, taken while the server
starts, and on shared cores two servers of one run measured 5.4 + 0.89 and 13.7 + 1.29 ms a token.
So the server goes on measuring with the steps it actually runs (the scheduler reports them):

* every ragged step it waits for (a verify step, or a plain step that is not pipelined) is a sample
  ``(N, ms)``, the ms from the step's start to its end (the rows' lookups, the forward, the
  decisions: what the step costs the batch); ``fixed_ms`` and ``per_token_ms`` are the weighted least-squares line through the
  samples, each sample's weight decaying by :data:`DECAY` with every newer one (so the fit follows
  the context and the load as they change, over the last few dozen steps), plus the load-time line
  as two light pseudo-samples that never decay (:data:`PRIOR_WEIGHT` each, at the measurement's
  two ends), which keep the line defined while every step carries the same ``N``;
* a step the pipeline runs (``server/runtime/run_ahead.py``: the next forward queued before this
  one's tokens are read back) should cost less than the same forward waited for, its host work
  overlapping the forward (on a quiet machine 4 rows took ~10 ms, 2.5 ms a token; on busy shared
  cores it hid little: ``docs/benchmarks.md``). Its sample is ``(B rows, ms between two pipelined steps)``, and what is learned is
  the ratio of that time to the line's ``fixed_ms + per_token_ms * B`` (a decayed mean, starting at
  1, i.e. priced as an unpipelined step until it has been seen), so one number carries the
  discount (or the surcharge) to every width.

A sample is clipped to within :data:`CLIP` (a quarter) of what the model predicts before it enters,
so its residual counts at most that much (a stall on a shared core, a garbage collection, one first
call: one sample moves the fit a few per cent, not double it); a real change of cost still gets
there in a few dozen steps, each sample pulling the fit its way by up to a quarter of the
prediction.

With the pipeline's price known, the bar changes where the rows would otherwise ride it (every row
decoding, nothing else waiting: the scheduler says so): the alternative to a draft is then one
token per ``ratio * (fixed_ms + per_token_ms * B) / B`` ms; where that is cheaper than the
unpipelined step's (a ratio below 1), a draft must be accepted more often to pay
(:meth:`LearnedCost.bar`). Not priced: that the first
draft in a step turns the whole step from a pipelined one into a waited-for one (the cap is one
row's, and whether any row drafts is known only after every row has looked up its block).

``MLXCEL_VERIFY_COST=measured`` (the default, unset): measured at load and never learned. A given model (``FIXED_MS,PER_TOKEN_MS``) is pinned too: it never learns and
prices a draft against the unpipelined step, as it always did, so tests and benchmarks that give
one see exactly the caps they saw before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxcel.engine.cache.batch import forward_chunk
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan, joinable
from mlxcel.engine.platform.settings import settings, value_in

_MEASURE_ROWS = 2
_MEASURE_WIDTHS = (1, 8, 16)  # tokens per row in the timed forwards
_MEASURE_CONTEXT = 32  # tokens each timed row holds
_MEASURE_ROUNDS = 4  # rounds over every width, after one warm-up each (measure)
PRIOR_ACCEPTED, PRIOR_TESTED = 4, 5  # a row's acceptance before its own evidence: 0.8 (VerifyCost.draft_cap)
DECAY = 0.96  # each sample's weight, for each newer sample (LearnedCost): about 17 steps to halve
PRIOR_WEIGHT = 0.5  # each of the load-time line's two pseudo-samples (never decays)
PRIOR_SPAN = (2, 32)  # the tokens N of those two pseudo-samples (the measurement's ends)
PROBE_EVERY = 8  # a row no draft of which pays drafts only on every PROBE_EVERY-th step (VerifyCost.draft_cap)
RATIO_PRIOR_WEIGHT = 2.0  # the pipelined ratio's starting 1.0, in samples (decays like them)
CLIP = 0.25  # a sample enters within this fraction of the model's prediction of it
MEASURED_ONLY = "measured"  # MLXCEL_VERIFY_COST=measured: measured at load, never learned (the default)
LEARN = "learn"  # MLXCEL_VERIFY_COST=learn: measured at load, then learned while serving


@dataclass(frozen=True)
class VerifyCost:
    """A shared verify forward of ``N`` tokens costs ``fixed_ms + per_token_ms * N``."""

    fixed_ms: float
    per_token_ms: float
    source: str = "given"  # "measured" or "given" (the environment)

    learns = False  # a fixed model: the scheduler reports no steps to it

    def step_ms(self, n: int) -> float:
        """What a forward of ``n`` tokens is modelled to cost."""
        return self.fixed_ms + self.per_token_ms * n

    def bar(self, rows: int, pipelined: bool = False) -> float:
        """The acceptance chance a draft must beat to pay for its token when ``rows`` rows share the
        forward: its token's cost over a plain step's cost per token. A fixed model knows no pipeline
        (``pipelined`` is ignored): the plain step it prices is the unpipelined one."""
        if self.per_token_ms <= 0:
            return 0.0
        return self.per_token_ms / (self.per_token_ms + self.fixed_ms / max(1, rows))

    def draft_cap(self, rows: int, accepted: int, tested: int, n_max: int, n_min: int = 0,
                  pipelined: bool = False, probe: bool = True, peeks: bool = False) -> int:
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
        A row whose first position does not pay either (``a`` at or under the bar) drafts nothing,
        except on a probe step (``probe``: the scheduler gives it on one step in :data:`PROBE_EVERY`,
        the same step for every row), where it drafts ``max(1, n_min)`` positions, so its acceptance
        keeps being measured and its cap can grow back. The probes are rare and taken together
        because every draft costs more than its own token where the rows ride the pipeline
        (``server/runtime/run_ahead.py``): a row that finds drafts turns the next step into a
        waited-for one for every row, and its lookup costs host time on every step it runs (with a
        one-draft floor, 8 prose clients of SmolLM2 drafted twice as many tokens, none accepted:
        docs/benchmarks.md). A row whose drafter ``peeks`` (``drafter.Drafter.peek``) needs no probe:
        while it drafts nothing it compares the token it would have drafted with the one emitted,
        for free, and ``accepted`` / ``tested`` count those too (``SpeculativeSession.evidence``);
        so it drafts nothing until it has evidence of its own, rather than on the prior, and never
        on a probe step. Otherwise never below ``n_min`` (the row's floor: a block shorter than it
        is not verified at all)."""
        return _cap(self.bar(rows, pipelined), rows, accepted, tested, n_max, n_min, probe, peeks)

    def describe(self) -> str:
        return f"{self.fixed_ms:.1f} ms + {self.per_token_ms:.2f} ms a token ({self.source})"


def _cap(bar: float, rows: int, accepted: int, tested: int, n_max: int, n_min: int, probe: bool = True,
         peeks: bool = False) -> int:
    """:meth:`VerifyCost.draft_cap` against a given ``bar``."""
    if n_max <= 0:
        return 0
    if rows <= 1:
        return n_max
    if peeks and tested == 0:
        return 0
    a = (accepted + PRIOR_ACCEPTED) / (tested + PRIOR_TESTED)
    k = 0
    while k < n_max and a ** (k + 1) > bar:
        k += 1
    if k == 0 and (peeks or not probe):
        return 0
    return min(n_max, max(k, n_min, 1))


def _clip(value: float, predicted: float) -> float:
    """``value`` moved to within :data:`CLIP` of ``predicted`` (a residual clipped, as a Huber fit does)."""
    if predicted <= 0:
        return value
    return min(max(value, predicted * (1 - CLIP)), predicted * (1 + CLIP))


class LearnedCost:
    """The verify forward's cost learned from the steps a server runs, starting at a measured one
    (module docstring: the decayed least squares, the pipelined ratio, the clip). The scheduler
    reports each ragged step it waited for (:meth:`observe_step`) and each interval between two
    pipelined steps (:meth:`observe_pipelined`); :meth:`draft_cap` is :class:`VerifyCost`'s, with
    the bar taken against the pipelined step where the rows would otherwise ride the pipeline."""

    learns = True

    def __init__(self, start: VerifyCost):
        self.start = start
        # the prior: the load-time line at N = PRIOR_SPAN, PRIOR_WEIGHT each, never decayed
        self._prior = [0.0] * 5
        for n in PRIOR_SPAN:
            self._add(self._prior, PRIOR_WEIGHT, n, start.step_ms(n))
        self._sums = [0.0] * 5  # weight, sum w*N, sum w*ms, sum w*N*N, sum w*N*ms (decayed)
        self.fixed_ms, self.per_token_ms = start.fixed_ms, start.per_token_ms
        self._ratio_w, self._ratio_sum = RATIO_PRIOR_WEIGHT, RATIO_PRIOR_WEIGHT * 1.0
        self.steps = 0  # samples of each kind taken so far
        self.pipelined_steps = 0

    @staticmethod
    def _add(sums: list[float], w: float, n: float, ms: float) -> None:
        sums[0] += w
        sums[1] += w * n
        sums[2] += w * ms
        sums[3] += w * n * n
        sums[4] += w * n * ms

    @property
    def source(self) -> str:
        return "learned"

    @property
    def pipelined_ratio(self) -> float:
        """What a pipelined plain step costs, as a fraction of the same forward waited for."""
        return self._ratio_sum / self._ratio_w

    def step_ms(self, n: int) -> float:
        return self.fixed_ms + self.per_token_ms * n

    def plain_ms_per_token(self, rows: int, pipelined: bool = False) -> float:
        """A plain step's cost per token at ``rows`` rows: pipelined or waited for."""
        rows = max(1, rows)
        ms = self.step_ms(rows) / rows
        return ms * self.pipelined_ratio if pipelined else ms

    def observe_step(self, n_tokens: int, ms: float) -> None:
        """A ragged forward of ``n_tokens`` tokens that took ``ms``, waited for."""
        if n_tokens <= 0 or not math.isfinite(ms) or ms <= 0:
            return
        ms = _clip(ms, self.step_ms(n_tokens))
        sums = self._sums
        for i in range(5):
            sums[i] *= DECAY
        self._add(sums, 1.0, n_tokens, ms)
        self.steps += 1
        self._fit()

    def observe_pipelined(self, rows: int, ms: float) -> None:
        """A pipelined plain step of ``rows`` rows (one token each) that took ``ms`` (from the start
        of the step before it to its own start)."""
        if rows <= 0 or not math.isfinite(ms) or ms <= 0:
            return
        predicted = self.step_ms(rows)
        if predicted <= 0:
            return
        ratio = _clip(ms / predicted, self.pipelined_ratio)
        self._ratio_w = self._ratio_w * DECAY + 1.0
        self._ratio_sum = self._ratio_sum * DECAY + ratio
        self.pipelined_steps += 1

    def _fit(self) -> None:
        w, sn, st, snn, snt = (a + b for a, b in zip(self._sums, self._prior))
        det = w * snn - sn * sn
        if det <= 1e-9 * max(1.0, w * snn):  # every sample at one N (and no prior): keep the slope
            per_token = self.per_token_ms
        else:
            per_token = (w * snt - sn * st) / det
        per_token = max(0.0, per_token)
        fixed = (st - per_token * sn) / w
        if fixed < 0:  # a line through the origin fits better: the least-squares slope without a fixed part
            fixed, per_token = 0.0, max(0.0, snt / snn) if snn > 0 else per_token
        self.fixed_ms, self.per_token_ms = fixed, per_token

    def bar(self, rows: int, pipelined: bool = False) -> float:
        """The acceptance chance a draft must beat: its token's cost over a plain step's cost per
        token, the pipelined step's when ``pipelined`` (the rows would otherwise ride the pipeline).
        Can exceed 1: then no draft pays (the cap drafts only to probe, or nothing, ``VerifyCost.draft_cap``)."""
        if self.per_token_ms <= 0:
            return 0.0
        plain = self.plain_ms_per_token(rows, pipelined)
        return self.per_token_ms / plain if plain > 0 else math.inf

    def draft_cap(self, rows: int, accepted: int, tested: int, n_max: int, n_min: int = 0,
                  pipelined: bool = False, probe: bool = True, peeks: bool = False) -> int:
        """:meth:`VerifyCost.draft_cap` with this model's :meth:`bar`."""
        return _cap(self.bar(rows, pipelined), rows, accepted, tested, n_max, n_min, probe, peeks)

    def describe(self) -> str:
        return (f"{self.fixed_ms:.1f} ms + {self.per_token_ms:.2f} ms a token, pipelined x{self.pipelined_ratio:.2f} "
                f"(learned from {self.steps} steps and {self.pipelined_steps} pipelined, "
                f"starting at {self.start.describe()})")


def from_env(environ: Mapping[str, str] | None = None) -> VerifyCost | None | str:
    """``MLXCEL_VERIFY_COST`` (this process's setting, or as ``environ`` gives it): a
    :class:`VerifyCost` when it gives one, ``"off"`` when it turns the cap off, ``"measured"`` when it
    asks for the load-time measurement alone, ``"learn"`` when it asks for the measurement learned
    from while serving, None when unset (measure)."""
    value = settings().verify_cost if environ is None else value_in(environ, "verify_cost")
    if isinstance(value, tuple):
        return VerifyCost(*value, source="given")
    return value


def measure(model: Any, make_cache: Callable[[], list[Any]], vocab_size: int, *,
            timed: Callable[[int, Callable[[], float]], float] | None = None) -> VerifyCost | None:
    """Time the ragged forward at a few widths on ``model`` and fit ``fixed + per_token * N``; None
    when the target's cache cannot join a ragged batch (its rows are then never verified together).

    After one warm-up forward per width, :data:`_MEASURE_ROUNDS` rounds each time every width once,
    the widths taking turns (the order rotates and reverses from round to round), and each width keeps
    its best. A stall (another process, a collection) lasts over consecutive forwards: timed back to
    back, the repeats of one width all fell in it, and one inflated point swung the line (this 2-core
    guest measured 41.5 ms + 1.03 ms a token at one start, 10.5-12.7 ms + 1.4-2.2 at others, and the
    first let a fresh row at 8 rows draft 8 tokens instead of 2-3). Interleaved, a stall costs a width
    one round, not its minimum. ``timed(n_tokens, run)`` returns the ms of one forward of
    ``n_tokens`` tokens, ``run()`` running it and returning its wall ms (the default); tests script
    stalls with it."""
    cache = make_cache()
    if not joinable(cache):
        return None
    tokens = [(7 * i + 3) % max(2, vocab_size) for i in range(_MEASURE_CONTEXT + max(_MEASURE_WIDTHS))]
    forward_chunk(model, tokens[:_MEASURE_CONTEXT], cache)
    batch = RaggedBatch(model)
    for row in range(_MEASURE_ROWS):
        batch.add(row, cache)

    def run(width: int) -> float:
        plan = StepPlan()
        for row in batch.rows:
            plan.add(row, tokens[_MEASURE_CONTEXT:_MEASURE_CONTEXT + width], batch.length(row))
        start = time.perf_counter()
        mx.eval(batch.forward(plan))
        elapsed = (time.perf_counter() - start) * 1e3
        for row in batch.rows:
            batch.rewind(row, width)
        return elapsed

    timed = timed or (lambda n, forward: forward())
    for width in _MEASURE_WIDTHS:  # warm-up: graph and buffer setup
        run(width)
    best = {width: math.inf for width in _MEASURE_WIDTHS}
    widths = list(_MEASURE_WIDTHS)
    for r in range(_MEASURE_ROUNDS):
        order = widths[r % len(widths):] + widths[:r % len(widths)]
        for width in order if r % 2 == 0 else order[::-1]:
            best[width] = min(best[width], timed(_MEASURE_ROWS * width, lambda w=width: run(w)))
    points = [(_MEASURE_ROWS * width, best[width]) for width in _MEASURE_WIDTHS]
    n_mean = sum(n for n, _ in points) / len(points)
    t_mean = sum(t for _, t in points) / len(points)
    slope = (sum((n - n_mean) * (t - t_mean) for n, t in points)
             / sum((n - n_mean) ** 2 for n, _ in points))
    per_token = max(0.0, slope)
    fixed = max(0.0, t_mean - per_token * n_mean)
    return VerifyCost(fixed, per_token, source="measured")


def load(model: Any, make_cache: Callable[[], list[Any]], vocab_size: int, *,
         may_measure: bool = True) -> VerifyCost | LearnedCost | None:
    """The cost model a server runs with: the environment's (pinned), else measured (and then learned,
    :class:`LearnedCost`, with ``MLXCEL_VERIFY_COST=learn``), when ``may_measure``
    (ranks serving in lockstep must derive the same caps, so they never measure nor learn), else
    None (no cap)."""
    given = from_env()
    if given == "off":
        return None
    if isinstance(given, VerifyCost):
        return given
    measured = measure(model, make_cache, vocab_size) if may_measure else None
    if measured is None or given != LEARN:
        return measured
    return LearnedCost(measured)
