"""The engine half of a scheduler iteration: every running request's row, stepped with
``engine.decode.step.run_step``, and each outcome applied to its request.

One path for every row: collect the rows of one backend, ``run_step`` them, apply the outcomes
(a prompt's progress and first token, a decoding row's token, a verify round's tokens), release
what finished. Rows live in one of three places, and a step runs each place's rows together:

* the **ragged batch** (``cache.ragged``: each row at its own length, O(1) rewind): on a model whose
  forward it runs flat (``packable``: llama / mistral / qwen2 layers), every prompt chunk, plain
  decoding row and speculating row of a drafter that proposes from tokens alone (prompt lookup, a
  draft model), on a speculative server or where the model runs the fused CPU ops; an iteration is
  then one forward. When only plain decoding rows run and nothing else waits, the rows' next tokens
  are picked without being read back and the next forward is queued over them first
  (``run_ahead.Pipeline``);
* **mlx-lm's batch cache** (``cache.batch.DecodeBatch``): plain decoding rows that cannot join the
  ragged batch (sliding windows, recurrent or quantized layers, other layer shapes), one token each;
* **their own cache**: prompt chunks of rows outside the ragged batch (each forward alone; a prompt's
  chunks up to its last image too, which bring the images' embeddings, ``engine.vision``), and the
  rows of drafters that read the target's hidden states, whose rounds verify on their own cache
  (the exactness probe gates their block width).

Inside mlx-lm's left-padded batch caches a speculating row's per-row rewind would mean moving its
whole KV history (measured at 15-55 ms a round on SmolLM2 here), which is why speculating rows
never join ``DecodeBatch``. Every row's logits are the bits it gets alone where the backend's kernels
allow (``cache.ragged``'s exactness note), and its decisions and draws are its own, so a request
gets the tokens it gets alone whatever runs beside it.

Every row carries its request's LoRA scales (``SlotRun.adapter_scales``, fixed when the request
starts), so rows with different adapters, or the same adapters at other scales, share these forwards.
"""

from __future__ import annotations

import logging
import time

from mlxcel.engine.cache.batch import DecodeBatch, forward_chunk, mergeable
from mlxcel.engine.cache.kv_cache import can_rewind
from mlxcel.engine.cache.ragged import RaggedBatch, joinable, packable
from mlxcel.engine.cache.recurrent import has_recurrent_state
from mlxcel.engine.decode.step import BatchCacheRows, OwnCaches, RaggedRows, Row, RowOutcome, Verify, run_step
from mlxcel.engine.model.lora_linear import active_scales, uniform_scales
from mlxcel.engine.platform.ragged_ops import runs_fused
from mlxcel.engine.platform.settings import settings
from mlxcel.engine.speculative.target_features import TargetFeatures
from mlxcel.engine.vision.prompt import ChunkMedia
from mlxcel.server.runtime import invariance
from mlxcel.server.runtime.draft_caps import DraftCaps
from mlxcel.server.runtime.failures import as_api_error
from mlxcel.server.runtime.faults import fail as inject_fault
from mlxcel.server.runtime.run_ahead import Pipeline
from mlxcel.server.runtime.slots import Slot, SlotRun
from mlxcel.server.runtime.speculation import DECLINED_CACHE
from mlxcel.server.runtime.step_trace import StepTrace
from mlxcel.server.runtime.task import Failed

log = logging.getLogger(__name__)


class Stepper:
    """Where the rows live and how an iteration steps them (module docstring). ``lives`` is the
    scheduler: its slots, limits, and the ends of a life (``release``, ``fail``, ``room``)."""

    def __init__(self, lives):
        self.lives = lives
        self.model = lives.lm.model
        self.batch = DecodeBatch(self.model)
        self.ragged = RaggedBatch(self.model)
        speculation = lives.speculation
        # MLXCEL_UNIFIED_STEP=0: the rows that need not share the ragged forward keep to the batch cache
        # (the benchmarks' baseline arm)
        self.unified = (packable(self.model) and (speculation is not None or runs_fused(self.model))
                        and settings().unified_step)
        self.caps = DraftCaps(speculation, lambda: lives.lockstep is not None)
        # where a row's tokens could depend on its neighbours (runtime/invariance.py): every row forwards
        # alone on its own cache (rows_alone), token drafters verify alone token by token (chain_verify)
        found = invariance.check(lives.lm, n_slots=len(lives.slots), ragged=self.unified, speculation=speculation)
        self.rows_alone = found.rows_alone
        # None: not probed yet (a server without a drafter probes at its first prediction)
        known = speculation is not None or runs_fused(self.model)  # the fused CPU ops are exact at any width
        self.chain_verify: bool | None = found.chain_verify if known else None
        if found.constant_caps:
            self.caps.cost = None
        self.pipeline = Pipeline(self)
        self.trace = StepTrace()  # MLXCEL_TRACE_STEPS (runtime/step_trace.py); off by default
        self.last_step: dict[str, int] = {}  # the last iteration's ragged forward (metrics, /slots)

    # -- where rows live --------------------------------------------------------------------------------

    def place(self, slot: Slot, model_drafter: bool, media=None) -> None:
        """A new run's prompt goes to the ragged batch where it can (prefilled in chunks beside the
        other rows), else it is prefilled in its own cache, as a prompt with images (``media``) is up
        to its last image: only a row's own forward takes its embeddings."""
        if media is not None and slot.run is not None and slot.run.n_past < media.plain_from:
            return
        if self.unified and not model_drafter and not self.rows_alone and joinable(slot.cache):
            self.ragged.add(slot.id, slot.cache)
            slot.cache = None

    def join_plain(self, slot: Slot, cache) -> None:
        """A plain decoding row joins the ragged batch where it can, else the batch cache; a cache
        that cannot batch (a quantized KV cache), or any row while rows must run alone
        (``rows_alone``), stays the slot's own and decodes in its own forward."""
        if self.rows_alone or not (joinable(cache) or mergeable(cache)):
            slot.cache = cache
        elif self.unified and joinable(cache):
            self.ragged.add(slot.id, cache)
            slot.cache = None
        else:
            self.batch.add(slot.id, cache)
            slot.cache = None

    def leave(self, slot: Slot) -> None:
        """An ended run's row leaves its batch; its cache goes back to the slot (prompt reuse)."""
        self.pipeline.leave(slot.id)
        if slot.id in self.batch:
            slot.cache = self.batch.remove([slot.id])[slot.id]
        if slot.id in self.ragged:
            slot.cache = self.ragged.remove([slot.id])[slot.id]

    def drop(self, slot: Slot) -> None:
        """A failed run's row leaves its batch, its cache dropped (a batch that cannot let it go
        starts afresh)."""
        self.pipeline.leave(slot.id)
        for name in ("batch", "ragged"):
            held = getattr(self, name)
            try:
                if slot.id in held:
                    held.remove([slot.id])
            except Exception:
                log.exception("could not remove slot %d from the %s", slot.id, name)
                setattr(self, name, type(held)(self.model))

    def reset(self) -> None:
        """Every row is gone (a full KV pool, a lockstep stop)."""
        self.batch = DecodeBatch(self.model)
        self.ragged = RaggedBatch(self.model)
        self.pipeline.ahead = None

    # -- the iteration ----------------------------------------------------------------------------------

    def step(self) -> None:
        """One iteration's forwards: prompts in their own caches, the batch cache, the ragged batch,
        then the rows that decode or verify on their own cache."""
        self._own_prompts()
        self._batch_step()
        self._ragged_step()
        self._own_rows()

    def _run(self, backend, rows: list[Row], runs: list[SlotRun], what: str) -> list[RowOutcome] | None:
        """``run_step``, with the faults a test injects; a failed forward fails every row it touched
        and empties their slots (the caller starts a fresh batch). None then."""
        try:
            if any(run.fault == "forward" and not run.prefilling for run in runs):
                inject_fault("forward")
            return run_step(backend, rows)
        except Exception as exc:
            log.exception("the %s forward failed; failing its %d rows", what, len(rows))
            error = as_api_error(exc)
            for row, run in zip(rows, runs):
                run.task.sink(Failed(error))
                self.lives.slots[row.key].empty()
            return None

    def _take(self, run: SlotRun, outcome: RowOutcome, now: float) -> None:
        """Accept a sampled row's token (or fail the run with its row's error)."""
        try:
            if outcome.error is not None:
                raise outcome.error
            if run.fault == "sample":
                inject_fault("sample")
            run.accept(run.sampled(outcome), now)
        except Exception as exc:
            log.exception("sampling failed in slot %d", run.slot.id)
            run.fail(as_api_error(exc))

    def emit(self, run: SlotRun, result) -> int:
        """Stream a round's tokens (the accepted drafts, then the target's own) up to where the run
        stops; count the round. Returns the accepted drafts counted."""
        now = time.perf_counter()
        used = 0
        for i, token in enumerate(result.emitted):
            run.accept(token, now, drafted=i < result.accepted)
            used += 1
            if run.done:
                break
        accepted = run.spec.record(result, used)
        self.lives.metrics.record_round(run.spec.counters.kind, result.proposed, accepted)
        if run.features is not None and result.kept_features is not None:
            run.features.append(result.kept_features.compact())
        return accepted

    def count_plain_step(self, rows: int) -> None:
        """A ragged step of ``rows`` plain decoding rows, one token each, in the metrics and /slots."""
        self.last_step = {"rows": rows, "tokens": rows, "width": 1, "draft_accepted": 0}
        self.lives.metrics.record_decode(rows)
        if self.lives.speculation is not None:
            self.lives.metrics.record_step(rows, rows, 0)

    def _release_done(self, runs) -> None:
        for run in runs:
            if run.done and run.slot.run is run:
                self.lives.release(run.slot, send=not run.task_failed)

    # -- prompts in their own cache ---------------------------------------------------------------------

    def _own_prompts(self) -> None:
        """Prompt chunks of the slots outside the ragged batch (a model drafter's rows, which keep the
        target's features, and caches that cannot join it): each forward alone, within --batch-size."""
        budget, rows, runs = self.lives.n_batch, [], []
        for slot in self.lives.slots:
            run = slot.run
            if run is None or not run.prefilling or budget <= 0 or slot.id in self.ragged:
                continue
            try:
                if run.fault == "prefill":
                    inject_fault("prefill")
                chunk, media = self._prompt_chunk(run, min(self.lives.n_ubatch, budget))
            except Exception as exc:
                log.exception("prefill failed in slot %d", slot.id)
                self.lives.fail(slot, exc)
                continue
            if not self.lives.room(len(chunk)):
                break
            last = run.n_past + len(chunk) >= len(run.prompt)
            layers = self.lives.speculation.feature_layers if run.features is not None else None
            rows.append(Row(slot.id, chunk, sampling=run.sampling() if last else None, features=layers, logits=1,
                            adapters=run.adapter_scales, media=media))
            runs.append(run)
            budget -= len(chunk)
        if not rows:
            return
        caches = {row.key: self.lives.slots[row.key].cache for row in rows}
        outcomes = self._run(OwnCaches(self.model, caches), rows, runs, "prompt")
        for row, run, out in zip(rows, runs, outcomes or ()):
            try:
                self._prompt_done(run, row.tokens, out)
            except Exception as exc:
                log.exception("prefill failed in slot %d", row.key)
                self.lives.fail(run.slot, exc)

    @staticmethod
    def _prompt_chunk(run: SlotRun, size: int) -> tuple[list[int], ChunkMedia | None]:
        """The run's next prompt chunk of about ``size`` tokens. Up to a prompt's last image a chunk
        never cuts an image (it is fed whole) and carries its images' embeddings (encoded now, so a
        tower that fails fails this run alone) and its tokens' positions (``engine.vision``)."""
        start, media = run.n_past, run.media
        if media is None or start >= media.plain_from:
            return run.prompt[start:start + size], None
        end = media.chunk_end(start, start + size)
        chunk_media = media.chunk(start, end)
        for _, image in chunk_media.spans:
            media.tower.encode(image)
        return run.prompt[start:end], chunk_media

    def _prompt_done(self, run: SlotRun, chunk: list[int], out: RowOutcome) -> None:
        if out.error is not None and out.token is None and run.n_past + len(chunk) < len(run.prompt):
            raise out.error
        if out.features is not None:
            run.features.append(out.features)
        now = time.perf_counter()
        run.advance_prompt(chunk, now)
        if run.prefilling:
            return
        if not run.done:
            self._take(run, out, now)
        slot = run.slot
        if run.done:
            self.lives.release(slot, send=not run.task_failed)
        elif run.wants_spec and _verifiable(slot.cache):
            # a speculating row keeps its own cache unless its session can share the ragged forward
            features = TargetFeatures.join(run.features) if run.features is not None else None
            run.features = [features] if features is not None else None
            run.start_speculating(self.lives.sessions.start(run.opts, run.prompt + run.generated, run.seed,
                                                            features, grammar=run.grammar, slot=slot.id))
            if run.spec.batchable and self.blocks_inexact():
                run.spec.block_exact = False  # verified alone, token by token (runtime/invariance.py)
            elif run.spec.batchable and not self.rows_alone and joinable(slot.cache):
                self.ragged.add(slot.id, slot.cache)
                slot.cache = None
        else:
            if run.wants_spec:
                self.lives.metrics.record_declined(DECLINED_CACHE)
                log.warning("slot %d: its cache cannot drop rejected drafts now (a wrapped sliding window or a "
                            "chunk boundary); this request is decoded plainly", slot.id)
            self.join_plain(slot, slot.cache)

    # -- the batch cache ----------------------------------------------------------------------------------

    def _batch_step(self) -> None:
        for key in list(self.batch.rows):
            run = self.lives.slots[key].run
            if run is not None and run.context_full():
                self.shift(self.lives.slots[key])
        if not len(self.batch) or not self.lives.room(len(self.batch)):
            return
        runs = [self.lives.slots[key].run for key in self.batch.rows]
        rows = [Row(run.slot.id, [run.generated[-1]], sampling=run.sampling(), adapters=run.adapter_scales)
                for run in runs]
        outcomes = self._run(BatchCacheRows(self.batch), rows, runs, "batched decode")
        if outcomes is None:
            self.batch = DecodeBatch(self.model)
            return
        self.lives.metrics.record_decode(len(rows))
        now = time.perf_counter()
        for run, out in zip(runs, outcomes):
            self._take(run, out, now)
        self._release_done(runs)

    # -- rows that verify on their own cache ------------------------------------------------------------

    def _own_rows(self) -> None:
        """The decoding rows outside the batches, each on its own cache: a verify round for each
        speculating row (a drafter that reads the target's hidden states, or rows that must verify
        alone), a token for each plain row (a cache that cannot batch, or rows that must run alone);
        every forward alone, the plain rows' draws together."""
        rows, runs = [], []
        for slot in self.lives.slots:
            run = slot.run
            if slot.cache is None or run is None or run.prefilling or run.done:
                continue
            if run.context_full():
                self.shift(slot)  # decodes plainly from now on
                continue
            if run.spec is not None:
                verify = Verify(run.spec, run.round_chain(), run.prompt + run.generated, room=run.round_room())
                rows.append(Row(slot.id, [], verify=verify, adapters=run.adapter_scales))
            else:
                rows.append(Row(slot.id, [run.generated[-1]], sampling=run.sampling(), adapters=run.adapter_scales))
            runs.append(run)
        if not rows or not self.lives.room(len(rows)):
            return
        caches = {row.key: self.lives.slots[row.key].cache for row in rows}
        outcomes = self._run(OwnCaches(self.model, caches), rows, runs, "own-cache")
        now = time.perf_counter()
        for row, run, out in zip(rows, runs, outcomes or ()):
            if row.verify is None:
                self._take(run, out, now)
                continue
            try:
                if out.error is not None:
                    raise out.error
                self.emit(run, out.round)
            except Exception as exc:
                log.exception("verify round failed in slot %d", row.key)
                run.fail(as_api_error(exc))
        self._release_done(runs)

    # -- context shift ------------------------------------------------------------------------------------

    def shift(self, slot: Slot) -> None:
        """--context-shift for a row whose context is full: drop tokens as upstream chooses them
        (``SlotRun.shift``) and re-evaluate what is kept into a fresh cache, which rejoins the plain
        rows. Upstream instead moves the kept keys to their new positions by re-rotating them;
        re-evaluating costs a prefill of the kept context but needs no model-specific position
        arithmetic, and the kept tokens then attend only to what is kept. A speculating row decodes
        plainly after its shift (its drafter's state is for the old positions)."""
        run = slot.run
        try:
            self.pipeline.leave(slot.id)
            for held in (self.batch, self.ragged):
                if slot.id in held:
                    held.remove([slot.id])
            run.stop_speculating()
            context = run.shift(self.lives.lm.add_bos)
            cache = self.lives.lm.make_cache()
            body = context[:-1]  # the last token is fed by the next decode step
            with active_scales(uniform_scales(run.adapter_scales)):
                for start in range(0, len(body), self.lives.n_ubatch):
                    forward_chunk(self.model, body[start:start + self.lives.n_ubatch], cache)
            slot.tokens = []
            self.join_plain(slot, cache)
        except Exception as exc:
            log.exception("context shift failed in slot %d", slot.id)
            self.lives.fail(slot, exc)

    # -- the ragged batch -----------------------------------------------------------------------------------

    def _ragged_step(self) -> None:
        """The iteration's one forward over the ragged batch: each row brings what it needs, at its
        own positions. A speculating row proposes its own block (capped by the forward's cost model at
        this batch width and the row's acceptance so far, ``draft_caps``) and brings its pending token
        and drafts; a plain row its pending token; a prefilling row its next prompt chunk (at most
        ``--ubatch-size`` tokens, the chunks together within what ``--batch-size`` leaves after the
        decoding rows; a row past the budget waits), with logits only where a prompt ends. When every
        row is a plain decoding row and nothing else waits, the step runs pipelined (``run_ahead``)."""
        self.caps.begin_step()
        if self.pipeline.ahead is not None:
            if self.pipeline.intact():
                self.pipeline.step()
                return
            self.pipeline.settle()
        t_step = time.perf_counter()
        for key in list(self.ragged.rows):
            slot = self.lives.slots[key]
            if slot.run is None:  # its request was ended elsewhere (lockstep): nothing left to forward
                self.ragged.remove([key])
            elif not slot.run.prefilling and slot.run.context_full():
                self.shift(slot)  # decodes plainly from now on, in a fresh cache
        if not len(self.ragged):
            return
        rows, runs, preps, chunks = self._ragged_rows()
        if not rows:
            return
        if not self.lives.room(sum(len(r.tokens) for r in rows)):
            return
        quiet = all(not p.drafts and not p.cut for p in preps.values())  # no row verifies drafts
        if not chunks and quiet and len(rows) == len(self.ragged) and self.pipeline.may_run_ahead(runs):
            self.pipeline.start(rows, runs, preps, t_step)
            return
        outcomes = self._run(RaggedRows(self.ragged), rows, runs, "iteration's")
        if outcomes is None:
            self.ragged = RaggedBatch(self.model)
            self.pipeline.ahead = None
            return
        t_forward = time.perf_counter()
        accepted = self._apply_ragged(rows, runs, outcomes, chunks)
        plan_tokens = sum(len(r.tokens) for r in rows)
        self.last_step = {"rows": len(self.ragged), "tokens": plan_tokens,
                          "width": max(len(r.tokens) for r in rows), "draft_accepted": accepted}
        decoding = len(rows) - len(chunks)
        if decoding:
            self.lives.metrics.record_decode(decoding)
        if self.lives.speculation is not None:  # a server that never speculates shows upstream's metrics only
            self.lives.metrics.record_step(len(self.ragged), plan_tokens, accepted)
        if not chunks:
            self.caps.observe_step(plan_tokens, t_step)
        self.record_trace(t_step, "step", rows, preps, len(chunks), accepted, t_forward)
        self._release_done(runs)

    def _ragged_rows(self) -> tuple[list[Row], list[SlotRun], dict, dict]:
        """The rows of the ragged step, in batch order: (rows, their runs, verify blocks by key,
        prompt chunks by key)."""
        keys = list(self.ragged.rows)
        runs_by_key = {key: self.lives.slots[key].run for key in keys}
        width = sum(1 for run in runs_by_key.values() if not run.prefilling)
        pipelined = self.caps.learning is not None and self.pipeline.would_ride(width)
        preps, decoding = {}, []
        for key in keys:
            run = runs_by_key[key]
            if run.prefilling:
                continue
            if run.spec is not None:
                try:
                    preps[key] = self._prepare(run, width, pipelined)
                except Exception as exc:
                    log.exception("drafting failed in slot %d", key)
                    run.fail(as_api_error(exc))
                    self.lives.release(run.slot, send=False)
                    continue
            decoding.append(key)
        budget, chunks = self.lives.n_batch - len(decoding), {}
        for key in keys:
            run = runs_by_key[key]
            if not run.prefilling or budget <= 0:
                continue
            try:
                if run.fault == "prefill":
                    inject_fault("prefill")
            except Exception as exc:
                log.exception("prefill failed in slot %d", key)
                self.lives.fail(run.slot, exc)
                continue
            chunks[key] = run.prompt[run.n_past:run.n_past + min(self.lives.n_ubatch, budget)]
            budget -= len(chunks[key])
        rows, runs = [], []
        for key in self.ragged.rows:
            run = runs_by_key[key]
            if key in preps:
                prep = preps[key]
                rows.append(Row(key, prep.block, verify=Verify(run.spec, run.round_chain(),
                                                               run.prompt + run.generated, prep),
                                adapters=run.adapter_scales))
            elif key in chunks:
                last = run.n_past + len(chunks[key]) >= len(run.prompt)
                rows.append(Row(key, chunks[key], sampling=run.sampling() if last else None,
                                adapters=run.adapter_scales))
            elif key in decoding:
                rows.append(Row(key, [run.generated[-1]], sampling=run.sampling(), adapters=run.adapter_scales))
            else:
                continue  # a prompt waiting for the chunk budget
            runs.append(run)
        return rows, runs, preps, chunks

    def _prepare(self, run: SlotRun, width: int, pipelined: bool):
        """A speculating row's block: the one prepared in the pipelined step before, or a new one."""
        carried, run.carried_prep = run.carried_prep, None
        if carried is not None and carried.position == len(run.prompt) + len(run.generated):
            return carried
        return run.spec.prepare(run.prompt + run.generated, run.round_room(), self.caps.cap(run.spec, width, pipelined))

    def _apply_ragged(self, rows: list[Row], runs: list[SlotRun], outcomes: list[RowOutcome], chunks: dict) -> int:
        """The ragged step's outcomes: prompts' progress (a finished one takes its first token and
        starts speculating when it asked to), plain rows' tokens, verify rounds' tokens. Returns the
        drafts accepted."""
        now = time.perf_counter()
        accepted_total = 0
        for row, run, out in zip(rows, runs, outcomes):
            if row.key in chunks:
                run.advance_prompt(row.tokens, now)
                if not run.prefilling and not run.done:
                    self._take(run, out, now)
            elif row.verify is not None:
                accepted_total += self._apply_round(run, out, len(rows), sum(len(r.tokens) for r in rows))
            else:
                self._take(run, out, now)
        for row, run in zip(rows, runs):
            if row.key in chunks and not run.done and not run.prefilling and run.wants_spec:
                try:
                    self._start_speculating(run)
                except Exception as exc:
                    log.exception("could not start speculating in slot %d", row.key)
                    self.lives.fail(run.slot, exc)
        return accepted_total

    def _apply_round(self, run: SlotRun, out: RowOutcome, n_rows: int, n_tokens: int) -> int:
        try:
            if out.error is not None:
                raise out.error
            result = out.round
            # set before the round's tokens stream out: a client that has them may ask /slots at once
            run.last_step = {"rows": n_rows, "tokens": n_tokens, "drafted": result.proposed,
                             "accepted": result.accepted}
            accepted = self.emit(run, result)
            run.last_step["accepted"] = accepted
            return accepted
        except Exception as exc:
            log.exception("verify round failed in slot %d", run.slot.id)
            run.fail(as_api_error(exc))
            return 0

    def _start_speculating(self, run: SlotRun) -> None:
        """A row whose prompt was prefilled in the ragged batch starts its speculative session; one
        whose drafter cannot share the forward leaves the batch for its own verify rounds."""
        run.start_speculating(self.lives.sessions.start(run.opts, run.prompt + run.generated, run.seed, None,
                                                        grammar=run.grammar, slot=run.slot.id))
        chain = run.spec.batchable and self.blocks_inexact()
        if chain:
            run.spec.block_exact = False  # verified alone, token by token (runtime/invariance.py)
        if not run.spec.batchable or chain:
            run.slot.cache = self.ragged.remove([run.slot.id])[run.slot.id]

    def blocks_inexact(self) -> bool:
        """Whether token drafters' verify blocks must be scored token by token, alone (probed at start-up
        on a speculative server, at the first prediction on another)."""
        if self.chain_verify is None:
            self.chain_verify = not invariance.blocks_exact(self.lives.lm, invariance.PREDICTION_BLOCK)
        return self.chain_verify

    def record_trace(self, t0: float, kind: str, rows: list[Row], preps: dict, prefilling: int, accepted: int,
                     t_forward: float | None) -> None:
        """One line of the opt-in step trace (``runtime/step_trace.py``)."""
        if not self.trace.on:
            return
        self.trace.record(kind=kind, t0=t0, rows=len(rows), tokens=sum(len(r.tokens) for r in rows),
                          prefill_rows=prefilling, verify_rows=sum(1 for p in preps.values() if p.drafts),
                          quiet_rows=sum(1 for p in preps.values() if not p.drafts),
                          drafts=sum(len(p.drafts) for p in preps.values()), accepted=accepted,
                          forward_ms=None if t_forward is None else (t_forward - t0) * 1e3)


def _verifiable(cache) -> bool:
    """Whether verify rounds can run on ``cache``: its attention layers can drop a rejected draft now,
    or it has recurrent layers (a verify round records what it needs to cut them back)."""
    return has_recurrent_state(cache) or can_rewind(cache, 1)

