"""How many drafts a speculating row may bring to a shared verify forward, and what the forwards cost.

The cost model (``engine.speculative.verify_cost``) prices a forward by its width; a row's cap at a
batch of ``width`` decoding rows follows from it and from the row's evidence so far
(``SpeculativeSession.evidence``). A row none of whose drafts pays and that cannot peek drafts only
on a probe step, one ragged step in ``PROBE_EVERY``, the same for every row: their probes break the
pipelined steps together, and every rank of a lockstep group counts the same steps. With
``MLXCEL_VERIFY_COST=learn`` the model learns from the steps this server runs: the ones the
scheduler waits for (``observe_step``) and the pipelined ones (``observe_pipelined``); not in
lockstep, where ranks must derive the same caps from timings that differ.
"""

from __future__ import annotations

import logging
import time

from mlxcel.engine.speculative.verify_cost import PROBE_EVERY

log = logging.getLogger(__name__)


class DraftCaps:
    def __init__(self, speculation, in_lockstep=lambda: False):
        self.cost = speculation.verify_cost if speculation is not None else None
        self._in_lockstep = in_lockstep
        self.steps = 0  # ragged steps begun: every PROBE_EVERY-th is a probe step
        self._mark: tuple[int, float] | None = None  # the last pipelined step's (rows, start)

    def begin_step(self) -> None:
        self.steps += 1

    def cap(self, spec, width: int, pipelined: bool = False) -> int | None:
        """The most drafts ``spec``'s row may bring to a forward of ``width`` decoding rows
        (``verify_cost.VerifyCost.draft_cap``; ``pipelined``: the rows would otherwise ride the
        pipeline, so a learned model prices the draft against the pipelined step); None without a
        cost model."""
        if self.cost is None:
            return None
        accepted, tested = spec.evidence
        return self.cost.draft_cap(width, accepted, tested, spec.n_max, spec.n_min, pipelined=pipelined,
                                   probe=self.steps % PROBE_EVERY == 0, peeks=spec.drafter.peeks)

    @property
    def learning(self):
        """The cost model when it learns from this server's steps, else None."""
        cost = self.cost
        return cost if cost is not None and cost.learns and not self._in_lockstep() else None

    def observe_step(self, n_tokens: int, t_step: float) -> None:
        """A ragged step the scheduler waited for (no prompt chunk in it): ``n_tokens`` tokens, from
        ``t_step`` to now (the lookups, the forward and the decisions: what the step costs the batch)."""
        self._mark = None  # the pipeline, if it ran, was left
        cost = self.learning
        if cost is not None:
            cost.observe_step(n_tokens, (time.perf_counter() - t_step) * 1e3)
            n = cost.steps
            if n & (n - 1) == 0 or n % 1024 == 0:  # the 1st, 2nd, 4th, ... step, then every 1024th
                log.info("Shared verify forward learned: %s", cost.describe())

    def observe_pipelined(self, rows: int, t0: float) -> None:
        """A pipelined step over ``rows`` rows starting at ``t0``: the time since the previous one
        started, when that one was a pipelined step of the same rows, is what a pipelined step costs."""
        mark, self._mark = self._mark, (rows, t0)
        cost = self.learning
        if cost is not None and mark is not None and mark[0] == rows:
            cost.observe_pipelined(rows, (t0 - mark[1]) * 1e3)

    def pipeline_left(self) -> None:
        """The pipeline stopped: the next step's start is not this one's end."""
        self._mark = None

    def pipeline_began(self, rows: int, t0: float) -> None:
        self._mark = (rows, t0)
