"""The scheduler: an asyncio front and the one engine thread that owns MLX.

Every MLX call happens on the engine thread; the event loop only queues tasks and reads events, so
it is never blocked by model work. The scheduler keeps the requests' lives; one iteration is

    take new tasks from the inbox (block only when there is nothing to do)
    drop cancelled tasks (a client that went away frees its slot within one step); fail tasks past
        --timeout, or every task once shutting down (begin_shutdown, on SIGTERM)
    run the jobs queued between steps (``call``: slot save/restore, metrics...)
    give waiting tasks free slots (reusing each slot's cached prompt prefix)
    step every running request once (``stepper.Stepper``: prompt chunks, decode tokens and verify
        blocks as rows of ``engine.decode.step.run_step``, one forward per place the rows live)
    end what finished: the final result out, the row's cache back to its slot

A task whose prompt is fully prefilled samples its first token from the prefill logits and decodes
from the next step, so new requests join between steps without waiting for the running ones to
finish. Nothing a row does reaches another row's cache.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from mlxcel.engine.cache.kv_cache import cache_length, can_rewind, rewind
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.model.lora_set import request_scales
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import new_matcher
from mlxcel.engine.sampling.random_keys import resolve_seed
from mlxcel.engine.speculative.target_features import TargetFeatures
from mlxcel.server.runtime.errors import ApiError, shutting_down, timed_out, unavailable
from mlxcel.server.runtime.failures import as_api_error
from mlxcel.server.runtime.faults import FaultPlan
from mlxcel.server.runtime.kv_pool import KvPool, exceeded
from mlxcel.server.runtime.metrics import Metrics
from mlxcel.server.runtime.slots import Slot, SlotRun, choose_slot, media_key, reusable_prefix
from mlxcel.server.runtime.speculation import DECLINED_IMAGES, PredictionSessions, Speculation, prediction_counts
from mlxcel.server.runtime.stepper import Stepper
from mlxcel.server.runtime.task import Deferred, Failed, Final, GenerationOptions, Job, Task

log = logging.getLogger(__name__)
T = TypeVar("T")


class Scheduler:
    def __init__(self, loaded: LoadedModel, *, n_slots: int = 4, n_ctx: int = 0, unified_kv: bool = True,
                 n_batch: int = 2048,
                 n_ubatch: int = 512, max_queue: int = 256, metrics: Metrics | None = None,
                 slot_prompt_similarity: float = 0.1, speculation: Speculation | None = None,
                 timeout: float = 0.0, context_shift: bool = False):
        self.lm = loaded
        if context_shift and loaded.vision is not None:  # as upstream: a context shift would cut images
            log.warning("--context-shift is not supported with a vision tower (multimodal); it is disabled")
            context_shift = False
        self.context_shift = context_shift  # a full context drops tokens and goes on (SlotRun.shift)
        self.speculation = speculation
        # what opens each speculating request's session: the server's drafter, or, without one, a request's
        # predicted output alone
        self.sessions = speculation if speculation is not None else PredictionSessions(loaded)
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
        self.timeout = timeout  # seconds a task may live (0: no limit); see _drop_ended
        self.faults = FaultPlan.from_env()
        self.lockstep = None  # serving across ranks: runtime/lockstep.py's Leader or Follower
        self._stopping = False
        self._draining = False  # set from a signal handler: plain attribute writes only
        self.steps = Stepper(self)  # where the rows live and how an iteration steps them
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
             t_arrival: float | None = None, media=None) -> TaskHandle:
        """Queue a task now (503 at once when the queue is full) and return its handle; must be
        called on the event loop. ``media``: the prompt's images (``engine.vision.prompt.PromptMedia``)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(event):
            loop.call_soon_threadsafe(events.put_nowait, event)

        task = Task(prompt_tokens=prompt_tokens, options=options, sink=sink, index=index, media=media)
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
                self.steps.pipeline.ahead = None
                for slot in self.slots:
                    if slot.busy:
                        self.fail(slot, exc)

    def _has_work(self) -> bool:
        return bool(self._pending) or bool(self._jobs) or any(s.busy for s in self.slots)

    def _iteration(self) -> None:
        if self.lockstep is None or self.lockstep.leads:
            self._drain(block=not self._has_work())
            pipeline = self.steps.pipeline
            if pipeline.ahead is not None and not pipeline.continues():
                pipeline.settle()
            self._drop_ended()
        if self.lockstep is not None:  # the iteration's inputs, from rank 0 to every rank (lockstep.py)
            self.lockstep.step(self)
        self._run_jobs()
        self._assign()
        self.steps.step()

    def waiting(self) -> bool:
        """Whether anything besides the running rows waits: a task for a slot, a job."""
        return bool(self._pending) or bool(self._jobs)

    @property
    def draining(self) -> bool:
        return self._draining or self._stopping

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
                self.release(slot, send=False)
                continue
            error = self._ending(task, now)
            if error is not None:
                log.warning("task %d ended in slot %d: %s", task.id, slot.id, error.message)
                task.sink(Failed(error))
                self.release(slot, send=False)

    def _assign(self) -> None:
        waiting = deque()
        while self._pending:
            task = self._pending.popleft()
            try:
                # as upstream, a request that lists no adapters runs at the global LoRA scales as they are now
                scales = request_scales(self.lm.adapters, task.options.lora)
                slot = choose_slot(self.slots, task, self.slot_prompt_similarity, scales, media_key(task.media))
            except Exception as exc:  # a task that cannot be placed fails now, not at its client's timeout
                log.exception("could not place task %d", task.id)
                task.sink(Failed(as_api_error(exc)))
                continue
            if slot is None:
                waiting.append(task)
                if not any(not s.busy for s in self.slots):
                    break
                continue
            try:
                self._start(slot, task, scales)
            except Exception as exc:
                log.exception("could not start task %d", task.id)
                task.sink(Failed(as_api_error(exc)))
                slot.run = None
        waiting.extend(self._pending)
        self._pending = waiting

    def _start(self, slot: Slot, task: Task, adapter_scales: tuple[float, ...] = ()) -> None:
        prompt = task.prompt_tokens
        media = task.media
        reuse = reusable_prefix(slot, prompt, adapter_scales, media_key(media)) if task.options.cache_prompt else 0
        reuse = min(reuse, len(prompt) - 1)  # at least one token is evaluated, for its logits
        reason = self.sessions.declines(task.options)
        if reason is not None:
            self.metrics.record_declined(reason)
        wants_spec = reason is None and self.sessions.asks(task.options)
        layers = self.sessions.feature_layers
        if layers is not None and media is not None:  # its drafter reads features an image prefill does not keep
            if wants_spec:
                self.metrics.record_declined(DECLINED_IMAGES)
            wants_spec, layers = False, None
        if layers is not None:
            # a model drafter reads the features of every cached token: reuse only what the slot has them of
            reuse = min(reuse, slot.reusable_features())
        if slot.cache is None or not can_rewind(slot.cache, len(slot.tokens) - reuse):
            slot.cache, slot.tokens, reuse = self.lm.make_cache(), [], 0
        else:
            rewind(slot.cache, len(slot.tokens) - reuse)
            slot.tokens = slot.tokens[:reuse]
        slot.adapter_scales = adapter_scales  # what the cache holds from here on is computed at these
        slot.media_key = media_key(media)  # and holds these images, at this position shift
        params = task.options.sampler
        chain = SamplerChain(params, vocab_size=self.vocab_size, eos_token_ids=self.eos_ids,
                             tokenizer=self.lm.tokenizer)
        seed = resolve_seed(task.options.seed)
        grammar = task.options.grammar
        matcher = new_matcher(grammar, self.lm.tokenizer, self.vocab_size, self.eos_ids) if grammar else None
        slot.run = SlotRun(slot, task, chain, seed, self.lm.tokenizer, self.eos_ids, cache_n=reuse,
                           context_shift=self.context_shift, grammar=matcher, adapter_scales=adapter_scales)
        slot.run.wants_spec = wants_spec
        if layers is not None:
            slot.run.features = [slot.features.rows(0, reuse)] if reuse else []
        slot.keep_features(None)
        if self.faults is not None:
            slot.run.fault = self.faults.stage_for(self.lm.tokenizer.decode(prompt))
        slot.last_used = time.perf_counter()
        self.steps.place(slot, model_drafter=layers is not None, media=media)
        slot.run.progress()

    def room(self, need: int) -> bool:
        """Whether the unified pool has room for ``need`` more tokens (always, without one). When it
        has none even after dropping idle slots' cached prompts, every running request ends with
        upstream's 500 "Context size has been exceeded." and its cache is cleared."""
        if self.pool is None or self.pool.make_room(self.slots, need):
            return True
        busy = [s for s in self.slots if s.busy]
        log.error("the unified KV pool (-c %d) is full: failing the %d running requests", self.pool.total, len(busy))
        for slot in busy:
            slot.run.task.sink(Failed(exceeded()))
        self.steps.reset()  # every row in them is gone
        for slot in busy:
            slot.empty()
        return False

    def release(self, slot: Slot, send: bool = True) -> None:
        """End the slot's run: send the final result, update metrics, then take its row out of the
        batch (keeping its cache for prompt reuse). The result goes first: the row's cache is copied
        out of the batch's (``RaggedBatch.remove``, a few ms for a long context) after the client has
        what it waits for; the slot is idle (``busy`` false, ``last_task`` this run) by the time the result
        arrives."""
        self.steps.pipeline.leave(slot.id)
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
            final.result.prediction = prediction_counts(run.opts, run.generated)
            t = final.result.timings
            self.metrics.record_request(t.prompt_n, t.cache_n, t.prompt_ms, t.predicted_n, t.predicted_ms,
                                        len(run.prompt) + len(run.generated))
            run.task.sink(final)
        self.steps.leave(slot)
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

    def fail(self, slot: Slot, exc: Exception) -> None:
        """End the slot's run with ``exc``'s error; its row and cache are dropped."""
        run = slot.run
        if run is None:
            return
        run.task.sink(Failed(as_api_error(exc)))
        self.steps.drop(slot)
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
