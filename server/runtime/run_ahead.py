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

import os
from dataclasses import dataclass

import mlx.core as mx

from mlxcel.engine.sampling.batch_select import Draw, pick_draws
from mlxcel.engine.speculative.block import PreparedRound
from mlxcel.server.runtime.slots import PendingSample, SlotRun

RUN_AHEAD_ENV = "MLXCEL_RUN_AHEAD"
QUIET_ENV = "MLXCEL_RUN_AHEAD_QUIET"  # 0: speculating rows never ride the pipeline (the A/B arm)


def enabled() -> bool:
    return os.environ.get(RUN_AHEAD_ENV, "1").lower() not in ("0", "false", "no", "off")


def quiet_enabled() -> bool:
    return os.environ.get(QUIET_ENV, "1").lower() not in ("0", "false", "no", "off")


_QUIET = quiet_enabled()


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
    return _QUIET and run.wants_spec and run.spec.quiet_ok


@dataclass
class Ahead:
    rows: list[int]
    runs: list[SlotRun]
    pending: list[PendingSample]
    draws: list[Draw]
    picks: list[mx.array | Exception]  # per row its [1] int32 token, lazy (queued)
    preps: list[PreparedRound | None]  # a speculating row's round of this pick (nothing drafted); None: plain

    @classmethod
    def pick(cls, rows: list[int], runs: list[SlotRun], logits: mx.array,
             preps: list[PreparedRound | None] | None = None) -> Ahead:
        """Each row's next token from its row of ``logits`` (``[len(rows), V]``), lazily. Not queued on
        its own: the next step's forward takes the picks as its input and evaluates them first (a
        queue call here would wait for the tail of this step's forward, the head, which the Python
        of the next step's graph can overlap instead)."""
        pending = [run.pending_sample(logits[j]) for j, run in enumerate(runs)]
        draws = [p.draw for p in pending]
        return cls(rows, runs, pending, draws, pick_draws(draws), list(preps or [None] * len(rows)))

    def drop(self, row: int) -> None:
        """Forget ``row`` (it leaves before its pick is read: the pick is never accepted)."""
        j = self.rows.index(row)
        for part in (self.rows, self.runs, self.pending, self.draws, self.picks, self.preps):
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
