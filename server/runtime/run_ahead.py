"""Pipelined decode steps: the next step queued before this step's tokens are read back.

When every row of the iteration's ragged forward is a plain decoding row and nothing else waits
(no new task, no job, no other kind of row), the scheduler runs its steps as
``decode.plain.generate_tokens`` runs one sequence: each row's next token is picked from the step's
logits lazily (``batch_select.pick_draws``, the very graph ``select_draws`` evaluates), the next
forward is queued over those lazy picks (``RaggedBatch.step``), and only then are the picks read
back and accepted. Building step n + 1's graph and the iteration's bookkeeping then
overlap the evaluation of step n instead of following it.

:class:`Ahead` is the state between two such iterations: per row its run, its pending sample and its
lazy pick. Invariant: each row's cache holds every token the run accepted; the pick is the next
token, not yet accepted. The scheduler *settles* it (reads the picks back and accepts them, leaving
the rows as an ordinary step does: the last accepted token not yet in the cache) as soon as anything
else must happen, and a row that ends on a token already forwarded drops that forward's entry
(``RaggedBatch.rewind``: O(1), exact). The tokens are the ones ``select_draws`` gives, so each row's
tokens are the ones it gets without the pipeline. ``MLXCEL_RUN_AHEAD=0`` turns it off.

A speculating row that drafts nothing this iteration (its lookup found nothing, the governor paused
it, the cost cap left it no draft) is a plain step too when its rule picks the token as plain
sampling does (greedy, sampler-match: ``SpeculativeSession.quiet_ok``): it rides the pipeline, each
picked token recorded as a round with nothing drafted (``SpeculativeSession.quiet``), and after each
pipelined step it looks up its next block as its round would; a row that finds drafts drops that
step's forward of its token (``RaggedBatch.rewind``) and keeps the block for the next iteration
(``SlotRun.carried_prep``); the other rows' picks are read back at once (settled), and that
iteration verifies the block.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import mlx.core as mx

from mlxcel.engine.cache.ragged import RaggedBatch
from mlxcel.engine.decode.step import RaggedRows, Row, RowOutcome
from mlxcel.engine.platform.settings import settings
from mlxcel.engine.sampling.batch_select import Draw, pick_draws
from mlxcel.engine.speculative.block import PreparedRound
from mlxcel.server.runtime.failures import as_api_error
from mlxcel.server.runtime.slots import SlotRun
from mlxcel.server.runtime.task import Failed

log = logging.getLogger(__name__)

def eligible(run: SlotRun | None) -> bool:
    """Whether a row may decode pipelined: a decoding row whose next token needs nothing the host
    computes from it (no grammar mask, no reasoning budget, no ``n_probs`` report, no fault): a plain
    row, or a speculating row whose round with nothing drafted is a plain step
    (``SpeculativeSession.quiet_ok``; it runs pipelined only in iterations where it drafts nothing)."""
    if not (run is not None and not run.done and not run.prefilling and run.grammar is None
            and run.budget is None and run.opts.n_probs <= 0 and run.fault is None
            and not run.task.cancelled.is_set()):
        return False
    if run.spec is None:
        return not run.wants_spec
    return run.wants_spec and run.spec.quiet_ok


@dataclass
class Ahead:
    rows: list[int]
    runs: list[SlotRun]
    draws: list[Draw]
    picks: list[mx.array | Exception]  # per row its [1] int32 token, lazy (queued)
    preps: list[PreparedRound | None]  # a speculating row's round of this pick (nothing drafted); None: plain

    @classmethod
    def pick(cls, rows: list[int], runs: list[SlotRun], logits: list[mx.array],
             preps: list[PreparedRound | None] | None = None) -> Ahead:
        """Each row's next token from its logits row (``[1, V]``), lazily. Not queued on its own: the
        next step's forward takes the picks as its input and evaluates them first (a queue call here
        would wait for the tail of this step's forward, the head, which the Python of the next step's
        graph can overlap instead)."""
        draws = [run.sampling().draw(row_logits, None) for run, row_logits in zip(runs, logits)]
        return cls(rows, runs, draws, pick_draws(draws), list(preps or [None] * len(rows)))

    def drop(self, row: int) -> None:
        """Forget ``row`` (it leaves before its pick is read: the pick is never accepted)."""
        j = self.rows.index(row)
        for part in (self.rows, self.runs, self.draws, self.picks, self.preps):
            del part[j]

    def ids(self) -> mx.array:
        """The picks as one ``[len(rows)]`` array (lazy), for the next forward."""
        return self.picks[0] if len(self.picks) == 1 else mx.concatenate(self.picks)

    def read(self, keep: list[int] | None = None) -> list[int | Exception]:
        """The picks of rows ``keep`` (indices; every row by default) read back: a token each, or the
        exception its draw raised. Each pick is read as it is, with no new operation: anything queued
        now would run after the next step's forward, which is already queued on the same stream."""
        out: list[int | Exception] = []
        for j in range(len(self.rows)) if keep is None else keep:
            pick = self.picks[j]
            if isinstance(pick, Exception):
                out.append(pick)
                continue
            try:
                out.append(int(pick.tolist()[0]))
            except Exception:  # its graph failed: built again alone, so that it fails (or not) on its own
                try:
                    out.append(int(_alone(self.draws[j])[0].tolist()[0]))
                except Exception as exc:
                    out.append(exc)
        return out


def _alone(draw: Draw) -> list[mx.array]:
    (pick,) = pick_draws([draw])
    if isinstance(pick, Exception):
        raise pick
    return [pick]


class Pipeline:
    """The ragged batch's pipelined plain steps (module docstring), for the scheduler's stepper
    (``runtime/stepper.py``): ``ahead`` is the state between two of them, or None."""

    def __init__(self, stepper):
        self.stepper = stepper
        self.enabled = settings().run_ahead  # MLXCEL_RUN_AHEAD=0: never (the benchmarks' other arm)
        self.ahead: Ahead | None = None

    @property
    def lives(self):
        return self.stepper.lives

    def may_run_ahead(self, runs: list[SlotRun]) -> bool:
        """Whether a ragged step over the plain decoding rows of ``runs`` may leave its tokens unread
        (the next step queued over them first): nothing but these rows is running or waiting."""
        lives = self.lives
        if not (self.enabled and lives.lockstep is None and self.stepper.ragged.fused and not lives.waiting()
                and not len(self.stepper.batch) and not lives.draining):
            return False
        if sum(1 for s in lives.slots if s.busy) != len(runs):
            return False
        return all(eligible(run) for run in runs)

    def would_ride(self, width: int) -> bool:
        """Whether the ragged batch's rows would ride the pipeline this iteration if no row drafted:
        every row decoding (``width`` of them), each eligible, nothing else waiting."""
        keys = self.stepper.ragged.rows
        return width == len(keys) and width > 0 and self.may_run_ahead([self.lives.slots[k].run for k in keys])

    def intact(self) -> bool:
        """Whether the rows of ``ahead`` are still exactly the ragged batch's, each with its run going on."""
        ahead = self.ahead
        return (self.stepper.ragged.rows == ahead.rows
                and all(self.lives.slots[r].run is run and eligible(run) for r, run in zip(ahead.rows, ahead.runs))
                and not any(isinstance(p, Exception) for p in ahead.picks))

    def continues(self) -> bool:
        """Whether this iteration is another pipelined step of the same rows (checked after new tasks
        are taken in): nothing else waits, no row ends for a reason outside its tokens, and every row
        has room for its picked token and one more (the last one allowed is read back alone)."""
        ahead = self.ahead
        if not self.may_run_ahead(ahead.runs) or not self.intact():
            return False
        now = time.perf_counter()
        for run in ahead.runs:
            if run.room() < 2 or run.task.deadline is not None and now > run.task.deadline:
                return False
        pool = self.lives.pool
        return pool is None or pool.make_room(self.lives.slots, 2 * len(ahead.rows))

    def start(self, rows: list[Row], runs: list[SlotRun], preps: dict, t_step: float) -> None:
        """The pipeline's first step: the ragged forward over ``rows`` (plain decoding rows, and
        speculating rows that draft nothing this step), the next tokens picked and not read back."""
        stepper = self.stepper
        try:
            forwarded = RaggedRows(stepper.ragged).forward(rows)
            self.ahead = Ahead.pick([r.key for r in rows], runs, [f.logits for f in forwarded],
                                    [preps.get(r.key) for r in rows])
        except Exception as exc:
            self._failed(exc, [r.key for r in rows], runs)
            return
        stepper.count_plain_step(len(rows))
        stepper.caps.pipeline_began(len(rows), t_step)
        stepper.record_trace(t_step, "step-ahead", rows, preps, 0, 0, None)

    def _failed(self, exc: Exception, keys: list[int], runs: list[SlotRun]) -> None:
        log.exception("the pipelined decode step failed; failing its %d rows", len(keys))
        error = as_api_error(exc)
        for key, run in zip(keys, runs):
            run.task.sink(Failed(error))
            self.lives.slots[key].empty()
        self.stepper.ragged = RaggedBatch(self.stepper.model)
        self.ahead = None

    def settle(self) -> None:
        """Read the picked tokens back and accept them: the rows are then as after an ordinary step (the
        last token accepted, not yet in the cache). Rows ended meanwhile (cancelled, failed) drop theirs."""
        ahead, self.ahead = self.ahead, None
        self.stepper.caps.pipeline_left()
        ragged = self.stepper.ragged
        keep = []
        for j, (row, run) in enumerate(zip(ahead.rows, ahead.runs)):
            if self.lives.slots[row].run is not run:
                continue
            if run.done or run.task.cancelled.is_set():
                if row in ragged:
                    ragged.rewind(row, 1)  # its pick is dropped: back to an ordinary step's cache
            else:
                keep.append(j)
        if not keep:
            return
        now = time.perf_counter()
        for j, value in zip(keep, ahead.read(keep)):
            run = ahead.runs[j]
            self._accept(run, value, now, ahead.preps[j])
            if run.done:
                self.lives.release(run.slot, send=not run.task_failed)

    def leave(self, row: int) -> None:
        """A row of ``ahead`` that leaves (released, failed) before its pick is read: the pick is dropped
        and the row's cache steps back to an ordinary step's (its last accepted token not in it)."""
        if self.ahead is not None and row in self.ahead.rows:
            self.ahead.drop(row)
            if row in self.stepper.ragged:
                self.stepper.ragged.rewind(row, 1)

    def _accept(self, run: SlotRun, value, now: float, prep=None) -> None:
        """Accept a row's picked token; a speculating row's (``prep``: its round, nothing drafted) as
        the round with nothing drafted that it is (``SpeculativeSession.quiet``)."""
        try:
            if isinstance(value, Exception):
                raise value
            if prep is not None and run.spec is not None:
                result = run.spec.quiet(prep, run.prompt + run.generated, int(value))
                n = len(self.stepper.ragged)
                run.last_step = {"rows": n, "tokens": n, "drafted": 0, "accepted": 0}
                self.stepper.emit(run, result)
                return
            run.accept(run.sampled(RowOutcome(run.slot.id, token=int(value))), now)
        except Exception as exc:
            log.exception("sampling failed in slot %d", run.slot.id)
            run.fail(as_api_error(exc))

    def step(self) -> None:
        """One pipelined step: the forward over the rows' picked tokens is queued, then the picks are
        read back (one readback) and accepted, and the next tokens are picked from the new logits. A row
        that ended on its pick drops that pick's forward (O(1), ``RaggedBatch.rewind``). A speculating
        row then looks up its next round's drafts as the round would; when one finds any, its forward of
        the token just read is dropped and the block kept for the next iteration to verify
        (``carried_prep``), and the other rows' new picks are read back at once (settled)."""
        stepper = self.stepper
        t0 = time.perf_counter()
        ahead, self.ahead = self.ahead, None
        rows, runs = ahead.rows, ahead.runs
        stepper.caps.observe_pipelined(len(rows), t0)
        try:
            logits = stepper.ragged.step(ahead.ids())
            values = ahead.read()
        except Exception as exc:
            self._failed(exc, rows, runs)
            return
        t_read = time.perf_counter()
        for j, run in enumerate(runs):
            self._accept(run, values[j], t_read, ahead.preps[j])
        preps, wants_drafts = self._look_up(rows, runs, ahead.preps)
        live = [j for j, run in enumerate(runs) if not run.done and run.carried_prep is None]
        if live:
            try:
                self.ahead = Ahead.pick([rows[j] for j in live], [runs[j] for j in live],
                                        [logits[j][None] for j in live], [preps.get(j) for j in live])
            except Exception as exc:
                log.exception("sampling failed in the pipelined decode step")
                for j in live:
                    runs[j].fail(as_api_error(exc))
        stepper.count_plain_step(len(rows))
        for row, run in zip(rows, runs):
            if run.done:
                stepper.ragged.rewind(row, 1)  # the forward over the token it ended on is not kept
                self.lives.release(self.lives.slots[row], send=not run.task_failed)
        if wants_drafts and self.ahead is not None:
            self.settle()  # the rows as after an ordinary step: the next iteration drafts
        if self.ahead is None:
            stepper.caps.pipeline_left()  # the pipeline stops here (every row ended or failed)
        if stepper.trace.on:
            stepper.trace.record(kind="ahead", t0=t0, rows=len(rows), tokens=len(rows), prefill_rows=0,
                                 verify_rows=0, quiet_rows=sum(1 for p in ahead.preps if p is not None),
                                 drafts=0, accepted=0, read_ms=(t_read - t0) * 1e3, settled=bool(wants_drafts))

    def _look_up(self, rows: list[int], runs: list[SlotRun], last_preps: list) -> tuple[dict, int]:
        """Each live speculating row's next block, looked up as its round would; a row that finds drafts
        drops this step's forward of its token and carries the block to the next ordinary iteration.
        Returns the quiet rows' blocks by index and how many rows found drafts."""
        preps, wants_drafts = {}, 0
        for j, run in enumerate(runs):
            if run.done or last_preps[j] is None or run.spec is None:
                continue
            try:
                cap = self.stepper.caps.cap(run.spec, len(rows), pipelined=True)
                prep = run.spec.prepare(run.prompt + run.generated, run.round_room(), cap)
            except Exception as exc:
                log.exception("drafting failed in slot %d", rows[j])
                run.fail(as_api_error(exc))
                continue
            if prep.drafts or prep.cut:
                wants_drafts += 1
                run.carried_prep = prep
                self.stepper.ragged.rewind(rows[j], 1)
                continue
            preps[j] = prep
        return preps, wants_drafts
