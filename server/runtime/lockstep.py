"""Serving across ranks: rank 0's scheduler leads, every other rank's scheduler follows in lockstep.

A model split by ``engine.distributed.sharding`` runs one forward as a collective of all ranks: each
rank must call the same forward, with the same shapes, in the same order. Every rank therefore runs
the same :class:`~mlxcel.server.runtime.scheduler.Scheduler` over its own shard and its own KV
caches; rank 0's also owns HTTP. Once per engine iteration, at the one seam where the scheduler's
inputs are settled (``Scheduler._iteration``, after new tasks are taken and ended ones dropped),
rank 0 sends that iteration's step plan with MLX's collectives:

    header  all_sum of int32 [payload bytes, stop, rank 0's state digest, one flag per rank]
    payload all_sum of uint8 (rank 0's bytes, zeros elsewhere), only when the header says so:
            the tasks admitted this iteration (id, prompt tokens, options with the seed resolved)
            and the tasks that ended outside the engine (cancelled, past --timeout, shutdown)

Everything else in the plan (which slot a task takes and what prefix it reuses, the prefill chunks,
the decode batch, the verify rounds and their rewinds) is a function of those inputs and of the
logits, which are bitwise the same on every rank (the last operation of every sharded layer is an
``all_sum``; the head runs on that same sum), so each rank's scheduler derives it identically; the
drafter (prompt lookup or a draft model) is replicated, and a verify round is one sharded forward.
Rather than trust that, every rank hashes its plan state (each slot's task, cached length,
prompt position and generated tokens, the decode batch's rows, the queue) after applying the
inputs and compares it with rank 0's digest in the header: a rank that differs says so in the next
header and rank 0 stops serving with an error, instead of serving tokens from diverged shards.

Faults: a collective that fails (a rank died: the ring backend reports the lost peer within a
fraction of a second) ends every open request on rank 0 with one clear error, refuses new ones and
stops the server (``on_lost``); a follower that loses rank 0 exits. The steady-state cost is one
small ``all_sum`` per iteration (measured in docs/benchmarks.md).

Work outside generation (``Scheduler.call``: embeddings, slot save/restore/erase) would run on rank 0
alone and is refused with a 501 in this mode.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import threading
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcel.engine.distributed.collectives import broadcast_bytes, sum_ints
from mlxcel.engine.platform.settings import settings
from mlxcel.engine.sampling.random_keys import resolve_seed
from mlxcel.server.runtime.errors import ApiError, not_supported
from mlxcel.server.runtime.task import Failed, Task

if TYPE_CHECKING:
    from mlxcel.server.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

STOPPING_STALL_S = 3.0  # the same once the server is asked to stop
_HEAD = 3  # payload length, stop, rank 0's digest; then one divergence flag per rank


def rank_lost(detail: str) -> ApiError:
    return ApiError(f"a rank of the distributed group stopped ({detail}); the server is stopping", "server_error",
                    status=500)


def plan_digest(sched: Scheduler) -> int:
    """A hash of the scheduler state the step plan is derived from (the same on every rank in step)."""
    parts = []
    for slot in sched.slots:
        run = slot.run
        if run is None:
            parts.append((slot.id, -1, len(slot.tokens)))
        else:
            parts.append((slot.id, run.task.id, len(slot.tokens), run.n_past, len(run.generated),
                          run.generated[-1] if run.generated else -1))
    parts.append(tuple(sched.steps.batch.rows))
    parts.append(tuple(sched.steps.ragged.rows))
    parts.append(tuple(task.id for task in sched._pending))
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class Leader:
    """Rank 0's end: sends each iteration's inputs; ``on_lost`` stops the server when a rank is gone."""

    leads = True

    def __init__(self, group: mx.distributed.Group, on_lost: Callable[[], None] | None = None):
        self.group = group
        self.on_lost = on_lost
        self.sent: set[int] = set()  # tasks the followers hold
        self.detached = False  # the group is gone or was told to stop: no more collectives
        self.iterations = 0
        self.last_step = time.monotonic()
        self._watchdog: threading.Thread | None = None

    def watch(self, sched: Scheduler) -> None:
        """Start the watchdog for a collective that never returns (see :meth:`_watch`)."""
        self._watchdog = threading.Thread(target=self._watch, args=(sched,), name="mlxcel-lockstep-watchdog",
                                          daemon=True)
        self._watchdog.start()

    def _watch(self, sched: Scheduler) -> None:
        """A dead peer usually makes the ring backend fail the next collective, but a collective can
        also wait forever on it. The engine thread steps at least every half second when idle; when
        it has not for ``MLXCEL_LOCKSTEP_STALL_S`` seconds (120; or for ``STOPPING_STALL_S`` once a
        signal, such as the one mlx.launch sends every rank when one exits, asks the server to stop),
        every open request is failed from here and the process ends, since the engine thread cannot
        be unblocked."""
        stall_s = settings().lockstep_stall_s  # no engine step for this long: a rank is lost
        while not self.detached:
            time.sleep(0.25)
            idle = time.monotonic() - self.last_step
            if idle > stall_s or (sched._draining and idle > STOPPING_STALL_S):
                self.lost(sched, rank_lost(f"no step for {idle:.0f} s: a collective is waiting on a rank that "
                                           "does not answer"))
                time.sleep(2.0)  # the error events reach their streams
                logging.shutdown()
                os._exit(1)

    def step(self, sched: Scheduler) -> None:
        self.last_step = time.monotonic()
        if self.detached:
            return
        while sched._jobs:  # they would run on this rank alone
            sched._jobs.popleft().done(None, not_supported(
                "not available while the model is served across ranks (mlx.launch): this work would run on "
                "rank 0 alone"))
        live = {task.id for task in sched._pending} | {s.run.task.id for s in sched.slots if s.run is not None}
        new = [task for task in sched._pending if task.id not in self.sent]
        for task in new:
            if task.options.seed is None or task.options.seed < 0:  # every rank must draw with one seed
                task.options = dataclasses.replace(task.options, seed=resolve_seed(task.options.seed))
        gone = sorted(self.sent - live)
        stop = sched._draining and not sched._has_work()
        payload = b""
        if new or gone:
            payload = pickle.dumps({"new": [(t.id, t.prompt_tokens, t.options, t.index) for t in new],
                                    "gone": gone}, protocol=pickle.HIGHEST_PROTOCOL)
        header = [0] * (_HEAD + self.group.size())
        header[0:_HEAD] = [len(payload), int(stop), plan_digest(sched)]
        try:
            header = sum_ints(self.group, header)
            broadcast_bytes(self.group, payload, len(payload))
        except Exception as exc:
            self.lost(sched, rank_lost(str(exc)))
            return
        self.sent = live
        self.iterations += 1
        self.last_step = time.monotonic()
        diverged = [r for r, flag in enumerate(header[_HEAD:]) if flag]
        if diverged:
            self.lost(sched, ApiError(f"rank {diverged[0]} left the lockstep (its step plan differs from rank 0's); "
                                      "the server is stopping", "server_error", status=500))
        elif stop:
            self.detached = True
            log.info("distributed: the other ranks were told to stop")

    def lost(self, sched: Scheduler, error: ApiError) -> None:
        """End every open request with ``error``, refuse new ones, stop the server."""
        log.error("%s", error.message)
        self.detached = True
        sched._draining = True  # new requests: 503 "shutting down"
        while True:  # tasks submitted but not yet drained
            try:
                item = sched._inbox.get_nowait()
            except Exception:
                break
            if isinstance(item, Task):
                item.sink(Failed(error))
            elif item is not None:
                item.done(None, error)
        for task in sched._pending:
            task.sink(Failed(error))
        sched._pending.clear()
        for slot in sched.slots:
            if slot.run is not None:
                slot.run.task.sink(Failed(error))
            slot.empty()
        sched.steps.reset()
        if self.on_lost is not None:
            self.on_lost()


class Follower:
    """Another rank's end: takes rank 0's inputs each iteration and mirrors them; its own tasks
    send their events nowhere."""

    leads = False

    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.tasks: dict[int, Task] = {}
        self.diverged = False
        self.exit_code = 0

    def step(self, sched: Scheduler) -> None:
        header = [0] * (_HEAD + self.group.size())
        header[_HEAD + self.group.rank()] = int(self.diverged)
        try:
            header = sum_ints(self.group, header)
            payload = broadcast_bytes(self.group, None, header[0])
        except Exception as exc:
            log.error("rank %d: lost the distributed group (%s); exiting", self.group.rank(), exc)
            self._stop(sched, 1)
            return
        if header[1]:
            log.info("rank %d: rank 0 is stopping; exiting", self.group.rank())
            self._stop(sched, 0)
            return
        if payload:
            plan = pickle.loads(payload)
            for task_id in plan["gone"]:
                task = self.tasks.pop(task_id, None)
                if task is not None:
                    task.cancel()
            sched._drop_ended()  # cancelled tasks leave their slots as on rank 0
            for task_id, prompt, options, index in plan["new"]:
                task = Task(prompt_tokens=prompt, options=options, sink=_discard, index=index, id=task_id)
                self.tasks[task_id] = task
                sched._pending.append(task)
        live = {task.id for task in sched._pending} | {s.run.task.id for s in sched.slots if s.run is not None}
        self.tasks = {i: t for i, t in self.tasks.items() if i in live}
        if not self.diverged and plan_digest(sched) != header[2]:
            self.diverged = True  # rank 0 hears of it in the next header and stops serving
            log.error("rank %d: step plan state differs from rank 0's", self.group.rank())

    def _stop(self, sched: Scheduler, code: int) -> None:
        self.exit_code = code
        sched._stopping = True
        sched._pending.clear()
        for slot in sched.slots:
            slot.empty()
        sched.steps.reset()


def _discard(event) -> None:
    """A follower's task events: rank 0 answers the client."""
