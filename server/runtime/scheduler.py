"""The scheduler: an asyncio front and the one engine thread that owns MLX.

Every MLX call happens on the engine thread; the event loop only queues tasks and reads events, so
it is never blocked by model work. The engine thread runs continuous batching over the slots:

    loop:
        take new tasks from the inbox (block only when there is nothing to do)
        drop cancelled tasks (a client that went away frees its slot within one step); fail tasks
            past --timeout, or every task once shutting down (begin_shutdown, on SIGTERM)
        give waiting tasks free slots (reusing each slot's cached prompt prefix)
        one ragged forward (``_ragged_step``) carrying, per row, what it needs: a prompt chunk
            (<= --ubatch-size tokens a row, <= --batch-size in all with the decoding rows), a plain
            row's pending token, a speculating row's verify block; then each speculating row decides
            on its own logits rows, and the plain rows and the prompts just finished sample their next
            token, each with its own chain (the grammar masks computed together, off the GIL, while
            the forward runs)
        what cannot join that forward runs as before: prompt chunks one forward each (``_prefill``),
            plain rows in one mlx-lm batch-cache forward (``_decode_batch``), speculating rows one
            verify round each (``_speculate``)

Which rows join the ragged batch (``engine.cache.ragged``, per-row lengths in one cache, O(1)
per-row rewind): rows on plain attention caches (``joinable``) of a model whose forward the batch
runs flat (``packable``: llama / mistral / qwen2 layers), on a speculative server, and on any server
where the model runs the fused CPU ops (packed weights on the CPU: there the ragged step is faster
than mlx-lm's batch cache even for plain rows, ``docs/benchmarks.md`` issue 17); among speculating
rows, those whose drafter proposes from tokens alone (prompt lookup, a draft model), on any model
with a joinable cache. Rows of model-based drafters (which read the target's hidden states, and
whose block width the exactness probe gates) keep their own cache, prefill and verify on their own.
On such a model an iteration is then one forward; every row's logits are the bits it gets alone
(the ragged batch's exactness note), and a row's decisions and samples are its own, so every
request gets the tokens it gets alone whatever runs beside it.

A task whose prompt is fully prefilled samples its first token from the prefill logits and joins
the decode rows before the next step, so new requests join between steps without waiting for the
running ones to finish. Inside mlx-lm's left-padded batch caches a speculating row's per-row rewind
would mean moving the row's whole KV history (measured at 15-55 ms per round on SmolLM2 here),
which is why speculating rows never join ``DecodeBatch``. Nothing a row does reaches another row's
cache.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import mlx.core as mx

from mlxcel.engine.cache.batch import DecodeBatch, forward_chunk
from mlxcel.engine.cache.kv_cache import cache_length, can_rewind, rewind
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan, joinable, packable
from mlxcel.engine.cache.recurrent import has_recurrent_state
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.platform.ragged_ops import runs_fused
from mlxcel.engine.sampling.batch_select import select_draws
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar import GrammarError
from mlxcel.engine.sampling.grammar_matcher import allowed_rows, fill_masks, new_matcher
from mlxcel.engine.sampling.random_keys import resolve_seed
from mlxcel.engine.speculative.session import decide_together
from mlxcel.engine.speculative.target_features import TargetFeatures, chunk_with_features
from mlxcel.engine.speculative.verify_cost import PROBE_EVERY
from mlxcel.server.runtime.errors import ApiError, invalid, shutting_down, timed_out, unavailable
from mlxcel.server.runtime.faults import FaultPlan
from mlxcel.server.runtime.faults import fail as inject_fault
from mlxcel.server.runtime.kv_pool import KvPool, exceeded
from mlxcel.server.runtime.metrics import Metrics
from mlxcel.server.runtime.run_ahead import Ahead, eligible
from mlxcel.server.runtime.run_ahead import enabled as run_ahead_enabled
from mlxcel.server.runtime.slots import Slot, SlotRun, choose_slot, common_prefix
from mlxcel.server.runtime.speculation import DECLINED_CACHE, Speculation
from mlxcel.server.runtime.step_trace import StepTrace
from mlxcel.server.runtime.task import Deferred, Failed, Final, GenerationOptions, Job, Task

log = logging.getLogger(__name__)
T = TypeVar("T")
UNIFIED_ENV = "MLXCEL_UNIFIED_STEP"


class Scheduler:
    def __init__(self, loaded: LoadedModel, *, n_slots: int = 4, n_ctx: int = 0, unified_kv: bool = True,
                 n_batch: int = 2048,
                 n_ubatch: int = 512, max_queue: int = 256, metrics: Metrics | None = None,
                 slot_prompt_similarity: float = 0.1, speculation: Speculation | None = None,
                 timeout: float = 0.0, context_shift: bool = False):
        self.lm = loaded
        self.context_shift = context_shift  # a full context drops tokens and goes on (SlotRun.shift)
        self.speculation = speculation
        n_slots = max(1, n_slots)
        self.n_ctx_total = n_ctx if n_ctx > 0 else loaded.context_length
        # As upstream: without a unified KV pool each slot gets its share of -c; either way no
        # slot's context exceeds the model's training context.
        per_slot = self.n_ctx_total if unified_kv else self.n_ctx_total // n_slots
        self.n_ctx = max(1, min(per_slot, loaded.context_length))  # each slot's context
        self.slots = [Slot(i, self.n_ctx) for i in range(n_slots)]
        # the unified pool's budget: every slot may use the whole -c, all of them together not more
        self.pool = KvPool(self.n_ctx_total) if unified_kv and n_slots > 1 else None
        self.n_batch = max(1, n_batch)
        self.n_ubatch = max(1, min(n_ubatch, self.n_batch))
        self.max_queue = max_queue
        self.slot_prompt_similarity = slot_prompt_similarity
        self.metrics = metrics or Metrics()
        self.eos_ids = set(loaded.eos_token_ids)
        self.vocab_size = loaded.vocab_size
        self._inbox: queue.Queue[Task | Job | None] = queue.Queue()
        self._pending: deque[Task] = deque()
        self._jobs: deque[Job] = deque()
        self._batch = DecodeBatch(loaded.model)
        # the rows of the iteration's one forward (module docstring)
        self._ragged = RaggedBatch(loaded.model)
        # Which rows besides the speculating ones share that forward: on a model whose forward the ragged
        # batch runs flat (``packable``), plain rows and prompt chunks too, on a speculative server (one
        # forward per iteration) and on any server where the model runs the fused CPU ops (there the
        # ragged step beats mlx-lm's batch cache even for plain rows: docs/benchmarks.md, issue 17).
        # MLXCEL_UNIFIED_STEP=0: the rows that need not share it run as before (benchmarks' baseline arm).
        self._unified = (packable(loaded.model) and (speculation is not None or runs_fused(loaded.model))
                         and os.environ.get(UNIFIED_ENV, "1").lower() not in ("0", "false", "no", "off"))
        self.last_step: dict[str, int] = {}  # the last iteration's ragged forward (metrics, /slots)
        # pipelined plain decode steps (runtime/run_ahead.py): the rows' next tokens picked, not yet read
        self._ahead: Ahead | None = None
        self._ragged_steps = 0  # ragged iterations begun: every PROBE_EVERY-th is a probe step (_draft_cap)
        self._run_ahead = run_ahead_enabled()
        self._ahead_mark: tuple[int, float] | None = None  # the last pipelined step's (rows, start): _learn_pipelined
        self._step_trace = StepTrace()  # MLXCEL_TRACE_STEPS (runtime/step_trace.py); off by default
        self.timeout = timeout  # seconds a task may live (0: no limit); see _drop_ended
        self.faults = FaultPlan.from_env()
        self.lockstep = None  # serving across ranks: runtime/lockstep.py's Leader or Follower
        self._stopping = False
        self._draining = False  # set from a signal handler: plain attribute writes only
        self._thread = threading.Thread(target=self._run, name="mlxcel-engine", daemon=True)

    # -- front (event loop side) ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def begin_shutdown(self) -> None:
        """Refuse new tasks and end every queued and running one with a "shutting down" error
        (their streams get an error event and close). Safe to call from a signal handler: it
        only sets a flag the engine thread reads each iteration."""
        self._draining = True

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=10)

    @property
    def deferred(self) -> int:
        """Tasks accepted but not yet in a slot."""
        return self._inbox.qsize() + len(self._pending)

    @property
    def processing(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    def submit(self, task: Task) -> None:
        if self._stopping or self._draining:
            raise shutting_down()
        if self.deferred >= self.max_queue:
            raise unavailable("the server is busy: too many requests are waiting; try again later")
        self._inbox.put(task)

    def open(self, prompt_tokens: list[int], options: GenerationOptions, index: int = 0,
             t_arrival: float | None = None) -> TaskHandle:
        """Queue a task now (503 at once when the queue is full) and return its handle; must be
        called on the event loop."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(event):
            loop.call_soon_threadsafe(events.put_nowait, event)

        task = Task(prompt_tokens=prompt_tokens, options=options, sink=sink, index=index)
        if t_arrival is not None:
            task.t_arrival = t_arrival
        if self.timeout > 0:
            task.deadline = task.t_arrival + self.timeout
        self.submit(task)
        return TaskHandle(task, events)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the engine thread between two steps and return what it returns (or raise
        what it raises). ``fn`` may raise ``task.Deferred`` to be run again after the next step."""
        if self._stopping or self._draining:
            raise shutting_down()
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def settle(value: Any, error: BaseException | None) -> None:
            if future.done():  # the caller went away
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        self._inbox.put(Job(fn, lambda value, error: loop.call_soon_threadsafe(settle, value, error)))
        return await future

    # -- engine thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._iteration()
            except Exception as exc:  # a bug must not kill the engine: fail what was running
                log.exception("engine step failed")
                self._ahead = None
                for slot in self.slots:
                    if slot.busy:
                        self._fail(slot, exc)

    def _has_work(self) -> bool:
        return bool(self._pending) or bool(self._jobs) or any(s.busy for s in self.slots)

    def _iteration(self) -> None:
        if self.lockstep is None or self.lockstep.leads:
            self._drain(block=not self._has_work())
            if self._ahead is not None and not self._ahead_continues():
                self._settle_ahead()
            self._drop_ended()
        if self.lockstep is not None:  # the iteration's inputs, from rank 0 to every rank (lockstep.py)
            self.lockstep.step(self)
        self._run_jobs()
        self._assign()
        self._prefill()
        self._decode()

    def _drain(self, block: bool) -> None:
        try:
            task = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(task, Job):
                self._jobs.append(task)
            elif task is not None:
                self._pending.append(task)
            try:
                task = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_jobs(self) -> None:
        """Run the queued jobs; one that is deferred waits for the next iteration."""
        waiting: deque[Job] = deque()
        while self._jobs:
            job = self._jobs.popleft()
            if self._draining:
                job.done(None, shutting_down())
                continue
            try:
                value = job.run()
            except Deferred:
                waiting.append(job)
                continue
            except Exception as exc:
                job.done(None, exc)
                continue
            job.done(value, None)
        self._jobs = waiting

    def _ending(self, task: Task, now: float) -> ApiError | None:
        """Why a live task must end now: the server is shutting down, or it passed --timeout."""
        if self._draining:
            return shutting_down()
        if task.deadline is not None and now > task.deadline:
            return timed_out(self.timeout)
        return None

    def _drop_ended(self) -> None:
        """Drop cancelled tasks (a client that went away frees its slot within one step); fail
        tasks past their deadline, or all of them while shutting down, freeing their slots."""
        now = time.perf_counter()
        if self._pending and (self._draining or any(t.cancelled.is_set() or t.deadline is not None and now > t.deadline
                                                    for t in self._pending)):
            keep: deque[Task] = deque()
            for task in self._pending:
                if task.cancelled.is_set():
                    continue
                error = self._ending(task, now)
                if error is not None:
                    task.sink(Failed(error))
                    continue
                keep.append(task)
            self._pending = keep
        for slot in self.slots:
            if not slot.busy:
                continue
            task = slot.run.task
            if task.cancelled.is_set():
                self._release(slot, send=False)
                continue
            error = self._ending(task, now)
            if error is not None:
                log.warning("task %d ended in slot %d: %s", task.id, slot.id, error.message)
                task.sink(Failed(error))
                self._release(slot, send=False)

    def _assign(self) -> None:
        waiting = deque()
        while self._pending:
            task = self._pending.popleft()
            slot = choose_slot(self.slots, task, self.slot_prompt_similarity)
            if slot is None:
                waiting.append(task)
                if not any(not s.busy for s in self.slots):
                    break
                continue
            try:
                self._start(slot, task)
            except Exception as exc:
                log.exception("could not start task %d", task.id)
                task.sink(Failed(_as_api_error(exc)))
                slot.run = None
        waiting.extend(self._pending)
        self._pending = waiting

    def _start(self, slot: Slot, task: Task) -> None:
        prompt = task.prompt_tokens
        reuse = common_prefix(slot.tokens, prompt) if task.options.cache_prompt else 0
        reuse = min(reuse, len(prompt) - 1)  # at least one token is evaluated, for its logits
        wants_spec, layers = False, None
        if self.speculation is not None:
            reason = self.speculation.declines(task.options)
            if reason is not None:
                self.metrics.record_declined(reason)
            wants_spec = reason is None and self.speculation.asks(task.options)
            layers = self.speculation.feature_layers
        if layers is not None:
            # a model drafter reads the features of every cached token: reuse only what the slot has them of
            reuse = min(reuse, slot.reusable_features())
        if slot.cache is None or not can_rewind(slot.cache, len(slot.tokens) - reuse):
            slot.cache, slot.tokens, reuse = self.lm.make_cache(), [], 0
        else:
            rewind(slot.cache, len(slot.tokens) - reuse)
            slot.tokens = slot.tokens[:reuse]
        params = task.options.sampler
        chain = SamplerChain(params, vocab_size=self.vocab_size, eos_token_ids=self.eos_ids,
                             tokenizer=self.lm.tokenizer)
        seed = resolve_seed(task.options.seed)
        grammar = task.options.grammar
        matcher = new_matcher(grammar, self.lm.tokenizer, self.vocab_size, self.eos_ids) if grammar else None
        slot.run = SlotRun(slot, task, chain, seed, self.lm.tokenizer, self.eos_ids, cache_n=reuse,
                           context_shift=self.context_shift, grammar=matcher)
        slot.run.wants_spec = wants_spec
        if layers is not None:
            slot.run.features = [slot.features.rows(0, reuse)] if reuse else []
        slot.keep_features(None)
        if self.faults is not None:
            slot.run.fault = self.faults.stage_for(self.lm.tokenizer.decode(prompt))
        slot.last_used = time.perf_counter()
        if self._unified and layers is None and joinable(slot.cache):
            # its prompt is prefilled in chunks beside the other rows, in the iteration's one forward
            self._ragged.add(slot.id, slot.cache)
            slot.cache = None
        slot.run.progress()

    def _prefill(self) -> None:
        """Prompt chunks of the slots outside the ragged batch (a model drafter's rows, which keep the
        target's features, and caches that cannot join it): one forward per chunk."""
        budget = self.n_batch
        for slot in self.slots:
            run = slot.run
            if run is None or not run.prefilling or budget <= 0 or slot.id in self._ragged:
                continue
            try:
                chunk = run.prompt[run.n_past:run.n_past + min(self.n_ubatch, budget)]
                if not self._room(len(chunk)):
                    return
                if run.fault == "prefill":
                    inject_fault("prefill")
                if run.features is not None:  # the prefill keeps what the model drafter reads (no second pass)
                    logits, part = chunk_with_features(self.lm.model, chunk, slot.cache, self.speculation.feature_layers)
                    run.features.append(part.compact())
                else:
                    logits = forward_chunk(self.lm.model, chunk, slot.cache)
                run.n_past += len(chunk)
                slot.tokens.extend(chunk)
                budget -= len(chunk)
                run.progress()
                if run.prefilling:
                    continue
                now = time.perf_counter()
                if run.limit() <= 0:
                    run.t_prefill_end = run.t_last = now
                    run.stop_type, run.done = "limit", True
                else:
                    run.accept(run.sample(logits), now)
                if run.done:
                    self._release(slot)
                elif run.wants_spec and self._verifiable(slot.cache):
                    # a speculating row keeps its own cache (see the module docstring)
                    features = TargetFeatures.join(run.features) if run.features is not None else None
                    run.features = [features] if features is not None else None
                    run.spec = self.speculation.start(run.opts, run.prompt + run.generated, run.seed, features,
                                                      grammar=run.grammar)
                    if run.spec.batchable and joinable(slot.cache):
                        self._ragged.add(slot.id, slot.cache)  # verified with the other rows (cache.ragged)
                        slot.cache = None
                else:
                    if run.wants_spec:
                        self.metrics.record_declined(DECLINED_CACHE)
                        log.warning("slot %d: its cache cannot drop rejected drafts now (a wrapped sliding window "
                                    "or a chunk boundary); this request is decoded plainly", slot.id)
                    self._join_plain(slot.id, slot.cache)
                    slot.cache = None
            except Exception as exc:
                log.exception("prefill failed in slot %d", slot.id)
                self._fail(slot, exc)

    @staticmethod
    def _verifiable(cache) -> bool:
        """Whether verify rounds can run on ``cache``: its attention layers can drop a rejected draft
        now, or it has recurrent layers (a verify round records what it needs to cut them back)."""
        return has_recurrent_state(cache) or can_rewind(cache, 1)

    def _join_plain(self, row: int, cache) -> None:
        """A plain decoding row joins the iteration's ragged forward where it can, else the decode batch."""
        if self._unified and joinable(cache):
            self._ragged.add(row, cache)
        else:
            self._batch.add(row, cache)

    def _decode(self) -> None:
        self._decode_batch()
        self._ragged_step()
        for slot in self.slots:
            run = slot.run
            if slot.id in self._ragged:
                continue
            if run is not None and run.spec is not None and not run.prefilling and not run.done:
                if not self._room(1):
                    return
                if run.context_full():
                    self._shift(slot)  # decodes plainly from now on
                else:
                    self._speculate(slot)

    def _room(self, need: int) -> bool:
        """Whether the unified pool has room for ``need`` more tokens (always, without one). When it
        has none even after dropping idle slots' cached prompts, every running request ends with
        upstream's 500 "Context size has been exceeded." and its cache is cleared."""
        if self.pool is None or self.pool.make_room(self.slots, need):
            return True
        busy = [s for s in self.slots if s.busy]
        log.error("the unified KV pool (-c %d) is full: failing the %d running requests", self.pool.total, len(busy))
        for slot in busy:
            slot.run.task.sink(Failed(exceeded()))
        self._batch = DecodeBatch(self.lm.model)  # every row in it is gone
        self._ragged = RaggedBatch(self.lm.model)
        self._ahead = None
        for slot in busy:
            slot.empty()
        return False

    def _speculate(self, slot: Slot) -> None:
        """One verify round for a speculating row, on its own cache."""
        run, spec = slot.run, slot.run.spec
        try:
            result = spec.round(self.lm.model, slot.cache, run.round_chain(), run.prompt + run.generated,
                                run.round_room())
            self._emit(run, result)
        except Exception as exc:
            log.exception("verify round failed in slot %d", slot.id)
            run.fail(_as_api_error(exc))
        if run.done:
            self._release(slot, send=not run.task_failed)

    def _emit(self, run: SlotRun, result) -> int:
        """Stream a round's tokens (the accepted drafts, then the target's own) up to where the run
        stops; count the round. Returns the accepted drafts counted."""
        spec = run.spec
        now = time.perf_counter()
        used = 0
        for i, token in enumerate(result.emitted):
            run.accept(token, now, drafted=i < result.accepted)
            used += 1
            if run.done:
                break
        accepted = spec.record(result, used)
        self.metrics.record_round(spec.counters.kind, result.proposed, accepted)
        if run.features is not None and result.kept_features is not None:
            run.features.append(result.kept_features.compact())
        return accepted

    def _ragged_step(self) -> None:
        """The iteration's one forward over the ragged batch (``cache.ragged``): each row brings what it
        needs, at its own positions. A speculating row proposes its own block (capped by the forward's
        cost model at this batch width and the row's acceptance so far, ``verify_cost``) and brings its
        pending token and drafts; a plain row its pending token; a prefilling row its next prompt chunk
        (at most ``--ubatch-size`` tokens, the chunks together within what ``--batch-size`` leaves after
        the decoding rows; a row past the budget waits), with logits only where a prompt ends. Then
        each speculating row's rule decides on its own rows and the row drops its own rejected tail
        (``_decide_rows``, the decisions a round alone makes), and the plain rows and the prompts just
        finished sample their next token (``_sample_rows``). When every row is a plain decoding row
        and nothing else waits, the rows' next tokens are picked but not read back: the next
        iteration queues its forward over them first (``runtime/run_ahead.py``, ``_step_ahead``)."""
        self._ragged_steps += 1
        if self._ahead is not None:
            if self._ahead_intact():
                self._step_ahead()
                return
            self._settle_ahead()
        t_step = time.perf_counter()
        for row in list(self._ragged.rows):
            slot = self.slots[row]
            if slot.run is None:  # its request was ended elsewhere (lockstep): nothing left to forward
                self._ragged.remove([row])
            elif not slot.run.prefilling and slot.run.context_full():
                self._shift(slot)  # decodes plainly from now on, in a fresh cache
        if not len(self._ragged):
            return
        preps, decoding, chunks = {}, [], {}
        width = sum(1 for r in self._ragged.rows if not self.slots[r].run.prefilling)
        pipelined = self._learning_cost() is not None and self._would_ride(width)  # only a learned model uses it
        for row in list(self._ragged.rows):
            slot = self.slots[row]
            run = slot.run
            if run.prefilling:
                continue
            decoding.append(row)
            if run.spec is None:
                continue
            try:
                spec = run.spec
                cap = self._draft_cap(spec, width, pipelined)
                carried, run.carried_prep = run.carried_prep, None
                if carried is not None and carried.position == len(run.prompt) + len(run.generated):
                    preps[row] = carried  # looked up in the pipelined step before (_step_ahead)
                else:
                    preps[row] = spec.prepare(run.prompt + run.generated, run.round_room(), cap)
            except Exception as exc:
                log.exception("drafting failed in slot %d", row)
                run.fail(_as_api_error(exc))
                decoding.remove(row)
                self._release(slot, send=False)
        budget = self.n_batch - len(decoding)
        for row in list(self._ragged.rows):
            run = self.slots[row].run
            if not run.prefilling or budget <= 0:
                continue
            try:
                if run.fault == "prefill":
                    inject_fault("prefill")
            except Exception as exc:
                log.exception("prefill failed in slot %d", row)
                self._fail(self.slots[row], exc)
                continue
            chunk = run.prompt[run.n_past:run.n_past + min(self.n_ubatch, budget)]
            chunks[row] = chunk
            budget -= len(chunk)
        if not decoding and not chunks:
            return
        if not self._room(len(decoding) + sum(len(c) for c in chunks.values())):
            return
        plan = StepPlan()
        for row in self._ragged.rows:
            run = self.slots[row].run
            if row in preps:
                plan.add(row, preps[row].block, self._ragged.length(row))
            elif row in chunks:
                last = run.n_past + len(chunks[row]) >= len(run.prompt)
                plan.add(row, chunks[row], self._ragged.length(row), logits=1 if last else 0)
            elif row in decoding:
                plan.add(row, [run.generated[-1]], self._ragged.length(row))
            else:
                plan.add(row, [], self._ragged.length(row))  # a prompt waiting for the chunk budget
        runs = [self.slots[r].run for r in plan.rows]
        sampling = [j for j, row in enumerate(plan.rows) if plan.logits[j] and row not in preps]
        quiet = all(not p.drafts and not p.cut for p in preps.values())  # no row verifies drafts
        ahead = not chunks and quiet and decoding == plan.rows and self._may_run_ahead(plan.rows, runs)
        try:
            if any(self.slots[r].run.fault == "forward" for r in decoding):
                inject_fault("forward")
            logits = self._ragged.forward(plan)
            if ahead:  # the tokens are read back after the next step is queued (_step_ahead)
                self._ahead = Ahead.pick(list(plan.rows), runs, [x[0] for x in logits],
                                         [preps.get(r) for r in plan.rows])
            else:
                allowed = self._masks([runs[j] for j in sampling], self.vocab_size)  # while the forward runs
                mx.eval([x for x in logits if x is not None])
                t_forward = time.perf_counter()
        except Exception as exc:
            log.exception("the iteration's forward failed; failing its %d rows", len(plan))
            error = _as_api_error(exc)
            self._fail_rows(plan.rows, runs, error)
            self._ragged = RaggedBatch(self.lm.model)
            self._ahead = None
            return
        if ahead:
            self._count_plain_step(len(plan))
            self._ahead_mark = (len(plan), t_step)  # the pipeline's first step
            self._trace(t_step, "step-ahead", plan, preps, len(chunks), 0, None)
            return
        now = time.perf_counter()
        finished = []
        for row, chunk in chunks.items():  # the prompts' progress; a finished one samples below
            run, slot = self.slots[row].run, self.slots[row]
            run.n_past += len(chunk)
            slot.tokens.extend(chunk)
            run.progress()
            if not run.prefilling and run.limit() <= 0:
                run.t_prefill_end = run.t_last = now
                run.stop_type, run.done = "limit", True
        live = [k for k, j in enumerate(sampling) if not runs[j].done]  # a prompt may have ended at its limit
        if live:
            picked = mx.concatenate([logits[sampling[k]] for k in live], axis=0)
            masks = {i: allowed[k] for i, k in enumerate(live) if k in allowed}
            finished += self._sample_rows([plan.rows[sampling[k]] for k in live], [runs[sampling[k]] for k in live],
                                          picked, masks)
        accepted_total = 0
        verifying = [j for j, row in enumerate(plan.rows) if row in preps]
        if verifying:
            accepted_total, done = self._decide_rows(plan, [plan.rows[j] for j in verifying],
                                                     [runs[j] for j in verifying], preps,
                                                     [logits[j] for j in verifying])
            finished += done
        finished += [row for row, run in zip(plan.rows, runs) if run.done and row not in finished]
        for row in chunks:
            run = self.slots[row].run
            if run is not None and not run.done and not run.prefilling and run.wants_spec:
                try:
                    self._start_speculating(self.slots[row])
                except Exception as exc:
                    log.exception("could not start speculating in slot %d", row)
                    self._fail(self.slots[row], exc)
        self.last_step = {"rows": len(plan), "tokens": plan.n_tokens, "width": plan.width,
                          "draft_accepted": accepted_total}
        if decoding:
            self.metrics.record_decode(len(decoding))
        if self.speculation is not None:  # a server that never speculates shows upstream's metrics only
            self.metrics.record_step(len(plan), plan.n_tokens, accepted_total)
        if not chunks:
            self._learn_step(plan.n_tokens, t_step)
        self._trace(t_step, "step", plan, preps, len(chunks), accepted_total, t_forward)
        for row in finished:
            self._release(self.slots[row], send=not self.slots[row].run.task_failed)

    def _trace(self, t0: float, kind: str, plan: StepPlan, preps: dict, prefilling: int, accepted: int,
               t_forward: float | None) -> None:
        """One line of the opt-in step trace (``runtime/step_trace.py``)."""
        if not self._step_trace.on:
            return
        drafts = sum(len(p.drafts) for p in preps.values())
        self._step_trace.record(kind=kind, t0=t0, rows=len(plan), tokens=plan.n_tokens, prefill_rows=prefilling,
                                verify_rows=sum(1 for p in preps.values() if p.drafts),
                                quiet_rows=sum(1 for p in preps.values() if not p.drafts),
                                drafts=drafts, accepted=accepted,
                                forward_ms=None if t_forward is None else (t_forward - t0) * 1e3)

    def _draft_cap(self, spec, width: int, pipelined: bool = False) -> int | None:
        """The most drafts ``spec``'s row may bring to a forward of ``width`` decoding rows (the verify
        cost model's cap, ``verify_cost.VerifyCost.draft_cap``; ``pipelined``: the rows would otherwise
        ride the pipeline, so a learned model prices the draft against the pipelined step); None
        without a cost model. The row's evidence counts its peeked tokens too
        (``SpeculativeSession.evidence``); a row none of whose drafts pays and that cannot peek
        drafts only on a probe step, one ragged iteration in ``PROBE_EVERY``, the same for every row
        (so that their probes break the pipeline together, and every rank of a lockstep group counts
        the same iterations)."""
        cost = self.speculation.verify_cost if self.speculation is not None else None
        if cost is None:
            return None
        accepted, tested = spec.evidence
        return cost.draft_cap(width, accepted, tested, spec.n_max, spec.n_min, pipelined=pipelined,
                              probe=self._ragged_steps % PROBE_EVERY == 0, peeks=spec.drafter.peeks)

    # -- the verify cost model learned from the steps run (verify_cost.LearnedCost) --------------------

    def _learning_cost(self):
        """The cost model when it learns from this server's steps (not in lockstep: ranks must derive
        the same caps, and their timings differ), else None."""
        cost = self.speculation.verify_cost if self.speculation is not None else None
        return cost if cost is not None and cost.learns and self.lockstep is None else None

    def _would_ride(self, width: int) -> bool:
        """Whether the ragged batch's rows would ride the pipeline this iteration if no row drafted:
        every row decoding (``width`` of them), each eligible, nothing else waiting."""
        rows = self._ragged.rows
        return (width == len(rows) and width > 0
                and self._may_run_ahead(list(rows), [self.slots[r].run for r in rows]))

    def _learn_step(self, n_tokens: int, t_step: float) -> None:
        """A ragged step the scheduler waited for (no prompt chunk in it): ``n_tokens`` tokens, from
        ``t_step`` to now (the lookups, the forward and the decisions: what the step costs the batch)."""
        self._ahead_mark = None  # the pipeline, if it ran, was left
        cost = self._learning_cost()
        if cost is not None:
            cost.observe_step(n_tokens, (time.perf_counter() - t_step) * 1e3)
            n = cost.steps
            if n & (n - 1) == 0 or n % 1024 == 0:  # the 1st, 2nd, 4th, ... step, then every 1024th
                log.info("Shared verify forward learned: %s", cost.describe())

    def _learn_pipelined(self, rows: int, t0: float) -> None:
        """A pipelined step over ``rows`` rows starting at ``t0``: the time since the previous one
        started, when that one was a pipelined step of the same rows, is what a pipelined step costs."""
        mark, self._ahead_mark = self._ahead_mark, (rows, t0)
        cost = self._learning_cost()
        if cost is not None and mark is not None and mark[0] == rows:
            cost.observe_pipelined(rows, (t0 - mark[1]) * 1e3)

    # -- pipelined plain steps (runtime/run_ahead.py) ---------------------------------------------------

    def _may_run_ahead(self, rows: list[int], runs: list[SlotRun]) -> bool:
        """Whether this ragged step over plain decoding rows ``rows`` may leave its tokens unread
        (the next step queued over them first): nothing but these rows is running or waiting."""
        if not (self._run_ahead and self.lockstep is None and self._ragged.fused and not self._pending
                and not self._jobs and not len(self._batch) and not self._draining and not self._stopping):
            return False
        if sum(1 for s in self.slots if s.busy) != len(rows):
            return False
        return all(eligible(run) for run in runs)

    def _ahead_intact(self) -> bool:
        """Whether the rows of ``_ahead`` are still exactly the ragged batch's, each with its run going on."""
        ahead = self._ahead
        return (self._ragged.rows == ahead.rows and all(self.slots[r].run is run and eligible(run)
                                                         for r, run in zip(ahead.rows, ahead.runs))
                and not any(isinstance(p, Exception) for p in ahead.picks))

    def _ahead_continues(self) -> bool:
        """Whether this iteration is another pipelined step of the same rows (checked after new tasks
        are taken in): nothing else waits, no row ends for a reason outside its tokens, and every row
        has room for its picked token and one more (the last one allowed is read back alone)."""
        ahead = self._ahead
        if not self._may_run_ahead(ahead.rows, ahead.runs) or not self._ahead_intact():
            return False
        now = time.perf_counter()
        for run in ahead.runs:
            if run.room() < 2 or run.task.deadline is not None and now > run.task.deadline:
                return False
        return self.pool is None or self.pool.make_room(self.slots, 2 * len(ahead.rows))

    def _settle_ahead(self) -> None:
        """Read the picked tokens back and accept them: the rows are then as after an ordinary step (the
        last token accepted, not yet in the cache). Rows ended meanwhile (cancelled, failed) drop theirs."""
        ahead, self._ahead = self._ahead, None
        self._ahead_mark = None  # the pipeline stops: the next step's start is not this one's end
        keep = []
        for j, (row, run) in enumerate(zip(ahead.rows, ahead.runs)):
            if self.slots[row].run is not run:
                continue
            if run.done or run.task.cancelled.is_set():
                if row in self._ragged:
                    self._ragged.rewind(row, 1)  # its pick is dropped: back to an ordinary step's cache
            else:
                keep.append(j)
        if not keep:
            return
        values = ahead.read(keep)
        now = time.perf_counter()
        for j, value in zip(keep, values):
            row, run = ahead.rows[j], ahead.runs[j]
            self._accept_pick(row, run, ahead.pending[j], value, now, ahead.preps[j])
            if run.done:
                self._release(self.slots[row], send=not run.task_failed)

    def _leave_ahead(self, row: int) -> None:
        """A row of ``_ahead`` that leaves (released, failed) before its pick is read: the pick is dropped
        and the row's cache steps back to an ordinary step's (its last accepted token not in it)."""
        if self._ahead is not None and row in self._ahead.rows:
            self._ahead.drop(row)
            if row in self._ragged:
                self._ragged.rewind(row, 1)

    def _accept_pick(self, row: int, run: SlotRun, pending, value, now: float, prep=None) -> None:
        """Accept a row's picked token; a speculating row's (``prep``: its round, nothing drafted) as
        the round with nothing drafted that it is (``SpeculativeSession.quiet``)."""
        try:
            if isinstance(value, Exception):
                raise value
            if prep is not None and run.spec is not None:
                result = run.spec.quiet(prep, run.prompt + run.generated, run.sampled(pending, value))
                run.last_step = {"rows": len(self._ragged), "tokens": len(self._ragged), "drafted": 0, "accepted": 0}
                self._emit(run, result)
                return
            run.accept(run.sampled(pending, value), now)
        except Exception as exc:
            log.exception("sampling failed in slot %d", row)
            run.fail(_as_api_error(exc))

    def _step_ahead(self) -> None:
        """One pipelined step: the forward over the rows' picked tokens is queued, then the picks are
        read back (one readback) and accepted, and the next tokens are picked from the new logits. A row
        that ended on its pick drops that pick's forward (O(1), ``RaggedBatch.rewind``). A speculating
        row then looks up its next round's drafts as the round would; when one finds any, its forward of
        the token just read is dropped and the block kept for the next iteration to verify
        (``carried_prep``), and the other rows' new picks are read back at once (settled)."""
        t0 = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        rows, runs = ahead.rows, ahead.runs
        self._learn_pipelined(len(rows), t0)
        try:
            logits = self._ragged.step(ahead.ids())
            values = ahead.read()
        except Exception as exc:
            log.exception("the pipelined decode step failed; failing its %d rows", len(rows))
            error = _as_api_error(exc)
            self._fail_rows(rows, runs, error)
            self._ragged = RaggedBatch(self.lm.model)
            return
        t_read = time.perf_counter()
        now = t_read
        for j, (row, run) in enumerate(zip(rows, runs)):
            self._accept_pick(row, run, ahead.pending[j], values[j], now, ahead.preps[j])
        live = [j for j, run in enumerate(runs) if not run.done]
        wants_drafts, preps = 0, {}
        for j in live:
            run = runs[j]
            if ahead.preps[j] is None or run.spec is None:
                continue
            sequence = run.prompt + run.generated
            try:
                spec = run.spec
                cap = self._draft_cap(spec, len(rows), pipelined=True)
                prep = spec.prepare(sequence, run.round_room(), cap)
            except Exception as exc:
                log.exception("drafting failed in slot %d", rows[j])
                run.fail(_as_api_error(exc))
                continue
            if prep.drafts or prep.cut:
                # found drafts for the block that starts at the token just read, which this step has
                # forwarded alone: that forward is dropped (the row is as after an ordinary step) and
                # the next ordinary iteration verifies the block with its drafts
                wants_drafts += 1
                run.carried_prep = prep
                self._ragged.rewind(rows[j], 1)
                continue
            preps[j] = prep
        live = [j for j in live if not runs[j].done and runs[j].carried_prep is None]
        if live:
            try:
                self._ahead = Ahead.pick([rows[j] for j in live], [runs[j] for j in live], [logits[j] for j in live],
                                         [preps.get(j) for j in live])
            except Exception as exc:
                log.exception("sampling failed in the pipelined decode step")
                for j in live:
                    runs[j].fail(_as_api_error(exc))
        self._count_plain_step(len(rows))
        for row, run in zip(rows, runs):
            if run.done:
                self._ragged.rewind(row, 1)  # the forward over the token it ended on is not kept
                self._release(self.slots[row], send=not run.task_failed)
        if wants_drafts and self._ahead is not None:
            self._settle_ahead()  # the rows as after an ordinary step: the next iteration drafts
        if self._ahead is None:
            self._ahead_mark = None  # the pipeline stops here (every row ended or failed)
        if self._step_trace.on:
            self._step_trace.record(kind="ahead", t0=t0, rows=len(rows), tokens=len(rows), prefill_rows=0,
                                    verify_rows=0, quiet_rows=sum(1 for p in ahead.preps if p is not None),
                                    drafts=0, accepted=0, read_ms=(t_read - t0) * 1e3, settled=bool(wants_drafts))

    def _count_plain_step(self, rows: int) -> None:
        """A ragged step of ``rows`` plain decoding rows, one token each, in the metrics and /slots."""
        self.last_step = {"rows": rows, "tokens": rows, "width": 1, "draft_accepted": 0}
        self.metrics.record_decode(rows)
        if self.speculation is not None:
            self.metrics.record_step(rows, rows, 0)

    def _start_speculating(self, slot: Slot) -> None:
        """A row whose prompt was prefilled in the ragged batch starts its speculative session; one
        whose drafter cannot share the forward leaves the batch for its own verify rounds."""
        run = slot.run
        run.spec = self.speculation.start(run.opts, run.prompt + run.generated, run.seed, None, grammar=run.grammar)
        if not run.spec.batchable:
            slot.cache = self._ragged.remove([slot.id])[slot.id]

    def _sample_rows(self, rows: list[int], runs: list[SlotRun], logits: mx.array,
                     allowed: dict[int, mx.array]) -> list[int]:
        """Each row's next token from its row of ``logits`` (``[len(rows), V]``) with its own chain
        (``allowed``: the grammar masks by row index); returns the rows that finished."""
        now = time.perf_counter()
        finished, pending = [], {}
        for j, (row, run) in enumerate(zip(rows, runs)):
            try:
                if run.fault == "sample":
                    inject_fault("sample")
                pending[j] = run.pending_sample(logits[j], allowed.get(j))
            except Exception as exc:
                log.exception("sampling failed in slot %d", row)
                run.fail(_as_api_error(exc))
        # every row's draw in one pass and one readback, each row's token the one it gets alone
        drawn = [j for j, p in pending.items() if p.draw is not None]
        tokens = dict(zip(drawn, select_draws([pending[j].draw for j in drawn])))
        for j, (row, run) in enumerate(zip(rows, runs)):
            if j in pending:
                try:
                    token = tokens[j] if j in tokens else [pending[j].forced]
                    if isinstance(token, Exception):
                        raise token
                    run.accept(run.sampled(pending[j], token[0]), now)
                except Exception as exc:
                    log.exception("sampling failed in slot %d", row)
                    run.fail(_as_api_error(exc))
            if run.done:
                finished.append(row)
        return finished

    def _decide_rows(self, plan: StepPlan, rows: list[int], runs: list[SlotRun], preps: dict,
                     logits: list[mx.array]) -> tuple[int, list[int]]:
        """Each speculating row's rule over its own rows of the forward (``logits[j]``: ``[len(block), V]``),
        the row's rejected tail dropped from its cache; returns the drafts accepted and the rows that finished."""
        accepted_total = 0
        finished = []
        # every row's decision in one pass and one readback, each the one its round alone makes
        rounds = []
        for j, (row, run) in enumerate(zip(rows, runs)):
            try:
                rounds.append((run.spec, run.spec.decide_row(preps[row], logits[j], run.round_chain(),
                                                             run.prompt + run.generated),
                               lambda n, row=row: self._ragged.rewind(row, n)))
            except Exception as exc:
                rounds.append(exc)
        results = iter(decide_together([r for r in rounds if not isinstance(r, Exception)]))
        for j, (row, run) in enumerate(zip(rows, runs)):
            try:
                result = rounds[j] if isinstance(rounds[j], Exception) else next(results)
                if isinstance(result, Exception):
                    raise result
                # set before the round's tokens stream out: a client that has them may ask /slots at once
                run.last_step = {"rows": len(plan), "tokens": plan.n_tokens, "drafted": result.proposed,
                                 "accepted": result.accepted}
                accepted = self._emit(run, result)
                accepted_total += accepted
                run.last_step["accepted"] = accepted
            except Exception as exc:
                log.exception("verify round failed in slot %d", row)
                run.fail(_as_api_error(exc))
            if run.done:
                finished.append(row)
        return accepted_total, finished

    def _shift(self, slot: Slot) -> None:
        """--context-shift for a row whose context is full: drop tokens as upstream chooses them
        (``SlotRun.shift``) and re-evaluate what is kept into a fresh cache, which rejoins the
        decode batch. Upstream instead moves the kept keys to their new positions by re-rotating
        them; re-evaluating costs a prefill of the kept context but needs no model-specific
        position arithmetic, and the kept tokens then attend only to what is kept. A speculating
        row decodes plainly after its shift (its drafter's state is for the old positions)."""
        run = slot.run
        try:
            if slot.id in self._batch:
                self._batch.remove([slot.id])
            if slot.id in self._ragged:
                self._ragged.remove([slot.id])
            if run.spec is not None:
                run.spec_ended, run.spec = run.spec, None
            run.features = None
            context = run.shift(self.lm.add_bos)
            cache = self.lm.make_cache()
            body = context[:-1]  # the last token is fed by the next decode step
            for start in range(0, len(body), self.n_ubatch):
                forward_chunk(self.lm.model, body[start:start + self.n_ubatch], cache)
            slot.cache, slot.tokens = None, []
            self._join_plain(slot.id, cache)
        except Exception as exc:
            log.exception("context shift failed in slot %d", slot.id)
            self._fail(slot, exc)

    def _decode_batch(self) -> None:
        for row in list(self._batch.rows):
            run = self.slots[row].run
            if run is not None and run.context_full():
                self._shift(self.slots[row])
        if not len(self._batch):
            return
        if not self._room(len(self._batch)):
            return
        rows = list(self._batch.rows)
        runs = [self.slots[r].run for r in rows]
        try:
            if any(run.fault == "forward" for run in runs):
                inject_fault("forward")
            logits = self._batch.queue_step([run.generated[-1] for run in runs])
            allowed = self._masks(runs, logits.shape[-1])  # while the forward runs
            mx.eval(logits)
        except Exception as exc:
            # the forward touched exactly these rows: fail them, start a fresh batch, keep serving
            log.exception("batched decode step failed; failing its %d rows", len(rows))
            error = _as_api_error(exc)
            self._fail_rows(rows, runs, error)
            self._batch = DecodeBatch(self.lm.model)
            return
        self.metrics.record_decode(len(rows))
        finished = self._sample_rows(rows, runs, logits, allowed)
        for row in finished:
            self._release(self.slots[row], send=not self.slots[row].run.task_failed)

    @staticmethod
    def _masks(runs: list[SlotRun], vocab_size: int) -> dict[int, mx.array]:
        """The grammar masks of the batch's constrained rows, by row index, computed in one call on
        llguidance's thread pool. A matcher that fails leaves its row to compute its own (and fail
        alone) in ``SlotRun.sample``."""
        rows = [(j, run.grammar) for j, run in enumerate(runs) if run.grammar is not None]
        if not rows:
            return {}
        try:
            masks = fill_masks([(matcher, ()) for _, matcher in rows])
        except GrammarError:
            return {}
        return {j: allowed_rows(mask, vocab_size) for (j, _), mask in zip(rows, masks)}

    def _release(self, slot: Slot, send: bool = True) -> None:
        """End the slot's run: send the final result, update metrics, then take its row out of the
        batch (keeping its cache for prompt reuse). The result goes first: the row's cache is copied
        out of the batch's (``RaggedBatch.remove``, a few ms for a long context) after the client has
        what it waits for; the slot is idle (``busy`` false, ``last_task`` this run) by the time the result
        arrives."""
        self._leave_ahead(slot.id)
        run = slot.run
        slot.run = None
        slot.last_task = {
            "id_task": run.task.id,
            "n_prompt_tokens": len(run.prompt),
            "n_prompt_tokens_processed": run.n_past - run.cache_n,
            "n_prompt_tokens_cache": run.cache_n,
            "options": run.opts,
            "n_decoded": len(run.generated),
            "has_new_line": "\n" in run.text,
        }
        if send:
            final = run.final()
            t = final.result.timings
            self.metrics.record_request(t.prompt_n, t.cache_n, t.prompt_ms, t.predicted_n, t.predicted_ms,
                                        len(run.prompt) + len(run.generated))
            run.task.sink(final)
        if slot.id in self._batch:
            slot.cache = self._batch.remove([slot.id])[slot.id]
        if slot.id in self._ragged:
            slot.cache = self._ragged.remove([slot.id])[slot.id]
        slot.tokens = run.cached_tokens()
        if slot.cache is not None and run.spec is not None:
            # a verify round may have forwarded tokens past where the request stopped
            try:
                extra = cache_length(slot.cache) - len(slot.tokens)
            except TypeError:  # a recurrent-only cache counts no positions: keep nothing unverifiable
                extra = -1
            if extra > 0 and can_rewind(slot.cache, extra):
                rewind(slot.cache, extra)
            elif extra != 0:
                slot.cache, slot.tokens = None, []
        slot.keep_features(TargetFeatures.join(run.features) if run.features and slot.cache is not None else None)
        slot.last_used = time.perf_counter()

    def _fail_rows(self, rows, runs, error) -> None:
        """The rows a failed shared forward touched: each request fails with ``error`` and its slot
        is emptied (the caller starts a fresh batch)."""
        for row, run in zip(rows, runs):
            run.task.sink(Failed(error))
            self.slots[row].empty()

    def _fail(self, slot: Slot, exc: Exception) -> None:
        run = slot.run
        if run is None:
            return
        self._leave_ahead(slot.id)
        run.task.sink(Failed(_as_api_error(exc)))
        try:
            if slot.id in self._batch:
                self._batch.remove([slot.id])
        except Exception:
            log.exception("could not remove slot %d from the batch", slot.id)
            self._batch = DecodeBatch(self.lm.model)
        try:
            if slot.id in self._ragged:
                self._ragged.remove([slot.id])
        except Exception:
            log.exception("could not remove slot %d from the ragged batch", slot.id)
            self._ragged = RaggedBatch(self.lm.model)
        slot.empty()


class TaskHandle:
    """The event loop's end of one task."""

    def __init__(self, task: Task, events: asyncio.Queue):
        self.task = task
        self.index = task.index
        self._events = events

    async def events(self) -> AsyncIterator:
        """The task's events up to and including :class:`Final`; a failure is raised. Leaving the
        iteration early cancels the task."""
        try:
            while True:
                event = await self._events.get()
                if isinstance(event, Failed):
                    raise event.error
                yield event
                if isinstance(event, Final):
                    return
        finally:
            self.task.cancel()

    async def result(self):
        async for event in self.events():
            if isinstance(event, Final):
                return event.result
        raise RuntimeError("task ended without a result")

    def cancel(self) -> None:
        self.task.cancel()


def _as_api_error(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, GrammarError):
        return invalid(f"Failed to initialize samplers: {exc}")
    return ApiError(f"generation failed: {type(exc).__name__}: {exc}", "server_error")
