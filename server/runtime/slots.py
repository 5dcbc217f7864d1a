"""Server slots: one sequence context each, its prompt cache, and the request it is running.

A slot keeps the KV cache of the last sequence it ran (``tokens`` says which tokens that cache
holds). A new request reuses the longest common prefix of its prompt with those tokens (the cache
is rewound to it) and reports the reused length as ``cache_n``; only a request that runs at the same
LoRA scales as the cache was computed with may reuse it (``Slot.adapter_scales``). :class:`SlotRun` is the per-request
state on the engine thread: sampler chain, generated tokens, detokenized text, stop strings,
timings — everything between "a token was sampled" and "an event goes out". Where a request is in
its life is its :class:`RunState`, set at each transition, as llama.cpp's ``slot_state``.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import mlx.core as mx

from mlxcel.engine.decode.step import RowOutcome, Sampling
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.engine.speculative.target_features import TargetFeatures
from mlxcel.engine.vision.prompt import NO_MEDIA, MediaKey, reusable_through
from mlxcel.server.runtime.detokenizer import IncrementalDetokenizer
from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.runtime.reasoning_budget import ReasoningBudget, forcing_params
from mlxcel.server.runtime.stop_strings import find_stop, partial_stop_length
from mlxcel.server.runtime.task import Failed, Final, Partial, Progress, Result, Task, TokenProb
from mlxcel.server.runtime.timings import Timings

log = logging.getLogger(__name__)

# How similar (common prefix / prompt length) a slot's cached tokens must be for the slot to be
# preferred over the least recently used one (llama-server's --slot-prompt-similarity default).
SLOT_PROMPT_SIMILARITY = 0.1


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Slot:
    id: int
    n_ctx: int
    cache: list[Any] | None = None  # single-sequence cache, when not in the decode batch
    tokens: list[int] = field(default_factory=list)  # tokens whose KV the slot's cache holds
    adapter_scales: tuple[float, ...] = ()  # the LoRA scales ``tokens`` were computed at (part of the cache's key)
    media_key: MediaKey = NO_MEDIA  # the images ``tokens`` hold and their position shift (part of the key too)
    # a model-based drafter's features of the tokens ``features_of`` (what the next request's drafter
    # needs of a reused prefix; kept only on a server with such a drafter)
    features: TargetFeatures | None = None
    features_of: list[int] = field(default_factory=list)

    def keep_features(self, features: TargetFeatures | None) -> None:
        """Keep ``features`` of the first tokens of ``tokens`` (as many as it has rows)."""
        n = min(features.length, len(self.tokens)) if features is not None else 0
        self.features = features.rows(0, n) if n else None
        self.features_of = list(self.tokens[:n])

    def reusable_features(self) -> int:
        """How many leading cached tokens the kept features are of (0 once ``tokens`` changed under them,
        e.g. a slot restored from a file)."""
        if self.features is None or self.tokens[:len(self.features_of)] != self.features_of:
            return 0
        return len(self.features_of)
    run: SlotRun | None = None
    last_used: float = 0.0
    last_task: dict = field(default_factory=dict)  # what /slots shows about the last request

    @property
    def busy(self) -> bool:
        return self.run is not None

    def empty(self) -> None:
        """Nothing held any more: no cache, no cached tokens, no request (its cache was lost with a
        failed forward, or the request failed)."""
        self.cache, self.tokens, self.run = None, [], None


def media_key(media) -> MediaKey:
    """What a cache computed from a prompt with ``media`` (``engine.vision.prompt.PromptMedia``, None for
    a text prompt) holds of images."""
    return media.key if media is not None else NO_MEDIA


def reusable_prefix(slot: Slot, prompt: list[int], adapter_scales: tuple[float, ...],
                    media: MediaKey = NO_MEDIA) -> int:
    """How many leading tokens of ``prompt`` the slot's cache holds for a request at ``adapter_scales``
    with images ``media`` (none when the cache was computed at other LoRA scales: its keys and values are
    another model's; and no further than the first image the two do not share, byte for byte and place
    for place: the placeholder tokens are the same whatever the image, ``engine.vision.prompt``)."""
    if slot.adapter_scales != adapter_scales:
        return 0
    n = common_prefix(slot.tokens, prompt)
    if media == NO_MEDIA and slot.media_key == NO_MEDIA:
        return n
    return min(n, reusable_through(slot.media_key, media, n))


def choose_slot(slots: list[Slot], task: Task, similarity: float = SLOT_PROMPT_SIMILARITY,
                adapter_scales: tuple[float, ...] = (), media: MediaKey = NO_MEDIA) -> Slot | None:
    """A free slot for ``task``: the one it asked for (``id_slot``, waiting while it is busy), else
    the free slot with the most similar cached prompt (at the request's LoRA scales), else the least
    recently used free one."""
    wanted = task.options.id_slot
    if 0 <= wanted < len(slots):
        slot = slots[wanted]
        return None if slot.busy else slot
    free = [s for s in slots if not s.busy]
    if not free:
        return None
    prompt = task.prompt_tokens
    if task.options.cache_prompt and prompt:
        best = max(free, key=lambda s: reusable_prefix(s, prompt, adapter_scales, media))
        if similarity > 0 and reusable_prefix(best, prompt, adapter_scales, media) / len(prompt) > similarity:
            return best
    return min(free, key=lambda s: s.last_used)


class RunState(Enum):
    """Where a request is in its life (set at each transition, never inferred from other fields)."""

    PREFILLING = "prefilling"  # its prompt is being fed, a chunk a step
    DECODING = "decoding"  # one token a step
    SPECULATING = "speculating"  # a verify round a step (its session is ``SlotRun.spec``)
    DONE = "done"  # ended (stopped, failed): its slot is released


class SlotRun:
    """One request running in one slot (engine thread only)."""

    def __init__(self, slot: Slot, task: Task, chain: SamplerChain, seed: int, tokenizer, eos_ids: set[int],
                 cache_n: int, context_shift: bool = False, grammar: GrammarMatcher | None = None,
                 adapter_scales: tuple[float, ...] = ()):
        self.slot = slot
        self.adapter_scales = adapter_scales  # its LoRA scales, one per adapter, for every forward it runs
        self.task = task
        self.opts = task.options
        self.chain = chain
        self.seed = seed
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.prompt = task.prompt_tokens
        self.media = task.media  # its prompt's images (engine.vision.prompt.PromptMedia), None for text
        self.cache_n = cache_n
        self.n_past = cache_n  # prompt tokens already in the cache
        self.generated: list[int] = []
        self.detok = IncrementalDetokenizer(tokenizer)
        self.text = ""
        self.sent = 0  # characters of ``text`` already streamed
        self.pending_tokens: list[int] = []
        self.pending_drafted: list[bool] = []  # per pending token: an accepted draft (not target-sampled)
        self.pending_probs: list[TokenProb] = []
        self.probs: list[TokenProb] = []
        self.state = RunState.PREFILLING
        self.stop_type = "none"
        self.stopping_word = ""
        self.truncated = False  # stopped because the slot's context was full
        self.last_nl_pos = 0  # where the line after the last newline of ``text`` starts (n_indent)
        self.t_prefill_start: float | None = None
        self.t_prefill_end = 0.0
        self.t_last = 0.0
        self.spec: SpeculativeSession | None = None  # its session while SPECULATING
        self.wants_spec = False  # the request speculates once its prefill is done
        self.carried_prep = None  # a round prepared in a pipelined step, verified by the next ordinary one
        self.features: list[TargetFeatures] | None = None  # a model drafter's features of every cached token
        self.spec_ended: SpeculativeSession | None = None  # speculated until a context shift (its counters)
        self.last_step: dict[str, int] | None = None  # the last shared verify forward it was in (/slots)
        # a constrained request's matcher: advanced over every accepted token; its end ends the request
        self.grammar = grammar
        self.context_shift = context_shift
        # after a context shift: the context at the shift (head) and where generated tokens join it
        self.head: list[int] | None = None
        self.head_from = 0
        self.task_failed = False
        self.fault: str | None = None  # faults.FaultPlan stage armed for this request (tests only)
        stops = self.opts.stop
        self.max_stop = max((len(s) for s in stops), default=0)
        spec = self.opts.reasoning_budget
        self.budget = ReasoningBudget(spec, complete=self._whole_character) if spec is not None else None

    # -- state ----------------------------------------------------------------------------------

    @property
    def prefilling(self) -> bool:
        return self.state is RunState.PREFILLING

    @property
    def done(self) -> bool:
        return self.state is RunState.DONE

    def finish(self, stop_type: str) -> None:
        """The request stops here (``stop_type``: upstream's ``eos``, ``word``, ``limit``)."""
        self.stop_type = stop_type
        self.state = RunState.DONE

    def start_speculating(self, spec: SpeculativeSession) -> None:
        self.spec = spec
        self.state = RunState.SPECULATING

    def stop_speculating(self) -> None:
        """Decode plainly from now on (a context shift); the session's counters stay in the report."""
        if self.spec is not None:
            self.spec_ended, self.spec = self.spec, None
        self.features = None
        if not self.done:
            self.state = RunState.DECODING

    # -- prompt ---------------------------------------------------------------------------------

    def advance_prompt(self, chunk: list[int], now: float) -> None:
        """``chunk`` of the prompt is in the cache: a progress event; when it was the last, the run
        decodes next, or stops at once when it may generate nothing."""
        self.n_past += len(chunk)
        self.slot.tokens.extend(chunk)
        self.progress()
        if self.n_past < len(self.prompt):
            return
        self.state = RunState.DECODING
        if self.limit() <= 0:
            self.t_prefill_end = self.t_last = now
            self.finish("limit")

    def progress(self) -> None:
        """A prompt-progress event (``return_progress`` on a stream): at prefill start and after each
        chunk; with ``timings_per_token`` it carries the prompt timings so far (zero at the start)."""
        if self.opts.return_progress and self.opts.stream:
            now = time.perf_counter()
            processed = self.n_past - self.cache_n  # run in this request (the cache is reused)
            if self.t_prefill_start is None:
                self.t_prefill_start = now
            timings = None
            if self.opts.timings_per_token:
                timings = Timings(cache_n=self.cache_n, prompt_n=processed,
                                  prompt_ms=(now - self.t_prefill_start) * 1e3 if processed else 0.0)
            # upstream's "processed" counts the prompt tokens in the cache so far, reused ones included
            self.task.sink(Progress(total=len(self.prompt), cache=self.cache_n, processed=self.n_past,
                                    time_ms=int((now - self.task.t_arrival) * 1000), timings=timings))

    # -- tokens ---------------------------------------------------------------------------------

    def limit(self) -> int:
        """How many tokens this request may generate in total: ``n_predict``, and no more than the
        context holds unless a context shift makes room (then -1 means no limit, as upstream)."""
        n = self.opts.n_predict
        if self.context_shift:
            return sys.maxsize if n < 0 else n
        room = self.slot.n_ctx - len(self.prompt)
        return room if n < 0 else min(n, room)

    def room(self) -> int:
        """How many more tokens this request may generate before it stops or its context must shift."""
        return min(self.limit() - len(self.generated), self.slot.n_ctx - len(self.context_tokens()))

    # -- context shift ----------------------------------------------------------------------------

    def context_tokens(self) -> list[int]:
        """The sequence the model sees: the prompt and every generated token, less what context
        shifts dropped."""
        if self.head is None:
            return self.prompt + self.generated
        return self.head + self.generated[self.head_from:]

    def context_full(self) -> bool:
        """Whether the next forward has no room (with --context-shift: shift first)."""
        return self.context_shift and bool(self.generated) and len(self.context_tokens()) >= self.slot.n_ctx

    def shift(self, add_bos: bool) -> list[int]:
        """Drop ``n_discard`` tokens after the first ``n_keep`` of the context, as upstream's context
        shift chooses them (``n_keep`` -1: the whole prompt; one more for BOS; at most ``n_ctx - 4``;
        ``n_discard`` 0: half of the rest; at least one token stays after). Returns the new context."""
        context = self.context_tokens()
        n_keep = len(self.prompt) if self.opts.n_keep < 0 else self.opts.n_keep
        n_keep = min(self.slot.n_ctx - 4, n_keep + (1 if add_bos else 0))
        n_left = len(context) - n_keep
        n_discard = self.opts.n_discard or n_left // 2
        n_discard = max(0, min(n_discard, max(0, n_left - 1)))
        log.warning("slot %d: context shift, n_keep = %d, n_left = %d, n_discard = %d",
                    self.slot.id, n_keep, n_left, n_discard)
        self.head = context[:n_keep] + context[n_keep + n_discard:]
        self.head_from = len(self.generated)
        self.truncated = True
        return self.head

    def _whole_character(self, token: int) -> bool:
        return not self.tokenizer.decode([token]).endswith("\ufffd")

    def round_chain(self) -> SamplerChain:
        """The sampler chain of the next verify round: the request's, or one that can only pick
        the token the reasoning budget forces (``reasoning_budget``)."""
        forced = self.budget.forced if self.budget is not None else None
        if forced is None:
            return self.chain
        return SamplerChain(forcing_params(forced), vocab_size=self.chain.vocab_size,
                            eos_token_ids=self.chain.eos_token_ids)

    def round_room(self) -> int:
        """How many tokens the next verify round may emit: ``room()``, and no further than a point
        where the reasoning budget may start forcing its end tag."""
        room = self.room()
        return room if self.budget is None else min(room, self.budget.round_limit())

    def sampling(self) -> Sampling:
        """How the next token is chosen: the request's chain at the next position, or the token the
        reasoning budget forces."""
        forced = self.budget.forced if self.budget is not None else None
        return Sampling(self.chain, self.prompt + self.generated, self.seed, self.grammar,
                        None if forced is None else int(forced))

    def sampled(self, outcome: RowOutcome) -> int:
        """The token a step chose for this row, its ``n_probs`` report recorded (read back on its own,
        after the step's one readback of tokens)."""
        token = int(outcome.token)
        if self.opts.n_probs > 0:
            history = self.prompt + self.generated
            prob = self._token_probs(outcome.logits[-1:], history, token, outcome.allowed)
            self.probs.append(prob)
            self.pending_probs.append(prob)
        return token

    def _token_probs(self, row: mx.array, history: list[int], token: int, allowed: mx.array | None) -> TokenProb:
        """What ``n_probs`` reports for this position: log-probabilities of the raw distribution,
        or probabilities of the effective one (the grammar's mask included) with ``post_sampling_probs``."""
        post = self.opts.post_sampling_probs
        (probs,) = self.chain.token_probs(row, [token], self.opts.n_probs, post_sampling=post, log_probs=not post,
                                          history=history, seed=self.seed, first_position=len(history),
                                          allowed=allowed if post else None)
        return TokenProb(id=token, value=probs.prob, top=probs.top)

    def accept(self, token: int, now: float, drafted: bool = False) -> None:
        """Record a sampled token: update text, check EOS / stop strings / limits, stream what is
        safe to stream. ``drafted``: the token is an accepted draft of a verify round."""
        if not self.generated:
            self.t_prefill_end = now
        self.t_last = now
        self.generated.append(token)
        self.pending_tokens.append(token)
        self.pending_drafted.append(drafted)
        if self.grammar is not None:
            self.grammar.advance([token])
        if self.budget is not None:
            self.budget.accept(token)
        if token in self.eos_ids and not self.opts.sampler.ignore_eos:
            self.finish("eos")
        else:
            delta = self.detok.add(token)
            if delta:
                start = len(self.text)
                self.text += delta
                if self.opts.stop:
                    hit = find_stop(self.text, self.opts.stop, start - self.max_stop + 1)
                    if hit is not None:
                        self.text = self.text[:hit[0]]
                        self.stopping_word = hit[1]
                        self.finish("word")
                if not self.done:
                    self._line_limits(delta, now)
        if not self.done and self.grammar is not None and self.grammar.stopped:
            self.finish("eos")  # the grammar is complete: only end-of-sequence could follow
        if not self.done and len(self.generated) >= self.limit():
            if not self.context_shift:
                self.truncated = len(self.prompt) + len(self.generated) >= self.slot.n_ctx  # the context is full
            self.finish("limit")
        if self.opts.stream:
            self._stream(final=self.done)

    def _line_limits(self, delta: str, now: float) -> None:
        """Upstream's two line-based limits. ``n_indent``: every line after the first must be indented
        by at least that many spaces or tabs; the first line that is not ends the generation, cut
        before its first other character. ``t_max_predict_ms``: past that many milliseconds of
        generation, the next newline ends it."""
        n_indent = self.opts.n_indent
        if n_indent > 0:
            if self.last_nl_pos > 0:
                pos = self.last_nl_pos
                while pos < len(self.text) and self.text[pos] in " \t":
                    pos += 1
                if pos < len(self.text) and pos - self.last_nl_pos < n_indent:
                    self.text = self.text[:pos]
                    self.finish("limit")
                    return
            newline = self.text.find("\n", self.last_nl_pos)
            if newline >= 0:
                self.last_nl_pos = newline + 1
        limit_ms = self.opts.t_max_predict_ms
        if limit_ms > 0 and "\n" in delta and (now - self.t_prefill_end) * 1e3 > limit_ms:
            self.finish("limit")

    def _stream(self, final: bool) -> None:
        """Send the text that can no longer turn into a stop string (all of it once done)."""
        end = len(self.text)
        if not final and self.opts.stop:
            end -= partial_stop_length(self.text[self.sent:], self.opts.stop)
        if end <= self.sent:
            return  # nothing settled yet (held back, or an incomplete character): keep the tokens
        text = self.text[self.sent:end]
        self.sent = end
        self.task.sink(Partial(text=text, tokens=self.pending_tokens, probs=self.pending_probs,
                               drafted=self.pending_drafted,
                               n_predicted=len(self.generated),
                               timings=self.timings() if self.opts.timings_per_token else None))
        self.pending_tokens = []
        self.pending_drafted = []
        self.pending_probs = []

    def fail(self, error: ApiError) -> None:
        """End the request with ``error`` (its stream gets an error event); the slot keeps its
        cache, as after any other end, and no final result is sent."""
        self.task.sink(Failed(error))
        self.state, self.task_failed = RunState.DONE, True

    # -- results --------------------------------------------------------------------------------

    def cached_tokens(self) -> list[int]:
        """The tokens whose KV is in this run's cache: the prompt so far, and every generated
        token but the last (sampled, never fed)."""
        if self.prefilling or not self.generated:
            return self.prompt[:self.n_past]
        return self.context_tokens()[:-1]

    def timings(self, draft: bool = False) -> Timings:
        """The nine base figures; with ``draft`` also the drafter's counters (only the final
        result carries them: a running total mid-stream is not a total yet). ``predicted_ms`` runs
        from the end of prefill over every verify round, as it does over plain steps."""
        spec = self.spec or self.spec_ended
        extra = {"draft": spec.counters} if draft and spec is not None else {}
        return Timings(
            cache_n=self.cache_n,
            prompt_n=len(self.prompt) - self.cache_n,
            prompt_ms=(self.t_prefill_end - self.task.t_arrival) * 1e3 if self.generated else 0.0,
            predicted_n=len(self.generated),
            predicted_ms=(self.t_last - self.t_prefill_end) * 1e3,
            **extra,
        )

    def final(self) -> Final:
        return Final(Result(
            content=self.text,
            tokens=list(self.generated) if self.opts.return_tokens else [],
            stop_type=self.stop_type,
            stopping_word=self.stopping_word,
            n_prompt=len(self.prompt),
            n_predicted=len(self.generated),
            tokens_cached=len(self.cached_tokens()),
            id_slot=self.slot.id,
            has_new_line="\n" in self.text,
            truncated=self.truncated,
            timings=self.timings(draft=True),
            probs=self.probs,
        ))
