"""One engine step: rows in, outcomes out.

A :class:`Row` is everything one sequence brings to a step: the tokens it feeds (a prompt chunk, its
pending token, or a verify block ``[pending, *drafts]``), and what is decided from the logits they
produce: the next token (:class:`Sampling`: its sampler chain, history, seed and grammar, or the token
a reasoning budget forces), or a verify round's acceptance (:class:`Verify`: its speculative session
and the prepared block). A row of a drafter that reads the target's hidden states names the layers
to keep (``features``). A row of a model with LoRA adapters carries its scales (``adapters``, one per
adapter): each backend lays them out for its forward's tokens (``model.lora_linear``), so rows with
different adapter mixes share one forward. A prompt chunk of a prompt with images carries them
(``media``: each image's embeddings for its positions, and where the text model places the chunk's
tokens, ``engine.vision``); only a row's own cache feeds such a chunk (its forward takes input
embeddings), the ragged batch and the batch cache refuse it.

:func:`run_step` runs a step on a :class:`Backend`, the place the rows' caches live:

1. **plan and forward**: the backend runs one forward over every row's tokens (the ragged batch:
   one forward whatever each row brings; mlx-lm's batch cache: one token a row; a row's own cache:
   its forward alone), queued;
2. **masks**: the grammar masks of the constrained rows, computed in one call while the forward runs;
3. **decide**: every sampled row's token in one pass and one readback (``batch_select.select_draws``),
   every verify row's acceptance in one pass and one readback (``decide.decide_rounds``, the one
   implementation of every rule); then each verify row's rejected tail is dropped from its cache
   and its drafter told.

A row's outcome is the one it gets alone: each backend gives a row the bits it gets alone where its
kernels allow (``cache.ragged``'s exactness note), and the draws and decisions are row-wise. A row
whose own work fails gets its exception in its :class:`RowOutcome` and the others go on; a failed
forward raises (it touched every row). Rows whose drafter must verify on its own cache, token by
token when a block forward is not exact (:class:`Verify` with no block), run
``SpeculativeSession.round`` on the backend that holds that cache.

The server's scheduler steps its slots through this function; ``mlxcel generate`` is a loop of
one-row steps (``decode.sequence``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx

from mlxcel.engine.cache.batch import DecodeBatch, last_position_logits
from mlxcel.engine.cache.kv_cache import rewind as rewind_cache
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan
from mlxcel.engine.model.lora_linear import active_scales, row_scales, uniform_scales
from mlxcel.engine.sampling.batch_select import Draw, select_draws
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, allowed_rows, fill_masks
from mlxcel.engine.speculative.block import PreparedRound, RoundResult, observe_round
from mlxcel.engine.speculative.decide import decide_rounds
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.engine.speculative.target_features import TargetFeatures, chunk_with_features
from mlxcel.engine.vision.forward import media_logits
from mlxcel.engine.vision.prompt import ChunkMedia


@dataclass
class Sampling:
    """How a row picks its next token from its last position's logits: ``SamplerChain.select``'s
    arguments (the token at absolute position ``len(history)``), or ``forced``, the token a
    reasoning budget forces (no draw)."""

    chain: SamplerChain
    history: Sequence[int]
    seed: int
    grammar: GrammarMatcher | None = None
    forced: int | None = None

    def draw(self, logits: mx.array, allowed: mx.array | None) -> Draw:
        """The draw of this row from its logits row ``[1, V]`` (``allowed``: its mask row)."""
        return Draw(self.chain, logits, self.history, seed=self.seed, first_position=len(self.history),
                    allowed=allowed)

    def pick(self, logits: mx.array) -> mx.array:
        """This row's token from its logits row ``[1, V]`` as a lazy ``[1]`` array, its grammar's mask
        applied (the forced token, when a budget forces one): what a pipelined loop queues its next
        forward on before reading it back."""
        if self.forced is not None:
            return mx.array([int(self.forced)], dtype=mx.int32)
        allowed = allowed_rows(self.grammar.masks(), logits.shape[-1]) if self.grammar is not None else None
        return self.chain.pick(logits, self.history, seed=self.seed, first_position=len(self.history),
                               allowed=allowed)


@dataclass
class Verify:
    """A verify round of a speculative session: ``prep`` the block the row feeds (its tokens), decided
    with ``chain`` after ``sequence`` (the sequence with its pending token last). ``prep`` None: the
    session prepares and verifies on the row's own cache (``SpeculativeSession.round``, up to
    ``room`` tokens), as a drafter that reads the target's hidden states does."""

    session: SpeculativeSession
    chain: SamplerChain
    sequence: Sequence[int]
    prep: PreparedRound | None = None
    room: int = 0


@dataclass
class Row:
    """One sequence's part of a step (module docstring). ``tokens`` are fed at the row's cache
    length; ``logits`` rows of its last positions are kept (None: what the row needs, its verify
    block's every row, one for a sampled row, none otherwise)."""

    key: Hashable
    tokens: list[int] | mx.array  # a lazy ``[n]`` array: tokens picked and not read back yet (a pipelined step)
    sampling: Sampling | None = None
    verify: Verify | None = None
    features: tuple[int, ...] | None = None  # hidden-state layers to keep (a model drafter's row)
    logits: int | None = None
    adapters: tuple[float, ...] = ()  # the row's LoRA scales, one per adapter (none: the base model)
    media: ChunkMedia | None = None  # a prompt chunk's images and token positions (own cache only)

    @property
    def wanted(self) -> int:
        if self.logits is not None:
            return self.logits
        if self.verify is not None:
            return len(self.tokens)
        return 1 if self.sampling is not None else 0


@dataclass
class RowOutcome:
    """What a step did for one row: the next ``token`` of a sampled row; a verify row's ``round``; the
    logits rows it kept and the mask it was drawn with (what an ``n_probs`` report reads); the
    hidden states of its tokens (``features``: a model drafter's row); or the ``error`` its own work
    raised."""

    key: Hashable
    token: int | None = None
    round: RoundResult | None = None
    logits: mx.array | None = None
    allowed: mx.array | None = None
    features: TargetFeatures | None = None
    error: Exception | None = None


@dataclass
class Forwarded:
    """A backend's forward of one row: its kept logits rows (lazy) and its features."""

    logits: mx.array | None = None
    features: TargetFeatures | None = None


class Backend(Protocol):
    """Where the rows' caches live, and how one forward runs over them."""

    def forward(self, rows: Sequence[Row]) -> list[Forwarded]:
        """Feed every row its tokens in one forward; each row's kept logits, queued."""

    def rewind(self, key: Hashable, n: int) -> None:
        """Drop the last ``n`` tokens of row ``key``'s cache (its rejected drafts)."""


class RaggedRows:
    """The ragged batch as a backend: every row in one forward, each at its own length
    (``cache.ragged``). A row of the batch that brings nothing waits (its cache unchanged)."""

    def __init__(self, batch: RaggedBatch):
        self.batch = batch

    def plan(self, rows: Sequence[Row]) -> StepPlan:
        _refuse_media(rows, "the ragged batch")
        by_key = {row.key: row for row in rows}
        plan = StepPlan()
        for key in self.batch.rows:
            row = by_key.get(key)
            plan.add(key, row.tokens if row is not None else [], self.batch.length(key),
                     logits=row.wanted if row is not None else 0, adapters=row.adapters if row is not None else ())
        return plan

    def forward(self, rows: Sequence[Row]) -> list[Forwarded]:
        plan = self.plan(rows)
        logits = dict(zip(plan.rows, self.batch.forward(plan)))
        return [Forwarded(logits[row.key]) for row in rows]

    def rewind(self, key: Hashable, n: int) -> None:
        self.batch.rewind(key, n)


class BatchCacheRows:
    """mlx-lm's batch cache (``cache.batch.DecodeBatch``) as a backend: every row of the batch
    feeds one token."""

    def __init__(self, batch: DecodeBatch):
        self.batch = batch

    def forward(self, rows: Sequence[Row]) -> list[Forwarded]:
        _refuse_media(rows, "a batch cache")
        by_key = {row.key: row for row in rows}
        if set(by_key) != set(self.batch.rows) or any(len(r.tokens) != 1 for r in rows):
            raise ValueError("a batch-cache step feeds one token to every row of the batch")
        with active_scales(row_scales([by_key[key].adapters for key in self.batch.rows])):
            logits = self.batch.queue_step([by_key[key].tokens[0] for key in self.batch.rows])
        at = {key: j for j, key in enumerate(self.batch.rows)}
        return [Forwarded(logits[at[row.key]][None]) for row in rows]

    def rewind(self, key: Hashable, n: int) -> None:
        raise ValueError("rows of a batch cache do not verify drafts")


class OwnCaches:
    """Rows that keep their own single-sequence cache (``caches[key]``): each row's forward runs
    alone, queued, with the head over its last position only (``cache.batch.last_position_logits``),
    and with the features a model drafter reads when the row names layers (evaluated). A row's
    tokens may be lazy (a pipelined step). A verify row's round runs in ``run_step``
    (``SpeculativeSession.round`` on the row's cache)."""

    def __init__(self, model: Any, caches: dict[Hashable, list[Any]]):
        self.model = model
        self.caches = caches

    def forward(self, rows: Sequence[Row]) -> list[Forwarded]:
        out = []
        for row in rows:
            if row.verify is not None:
                out.append(Forwarded())  # the session's own round forwards (run_step)
                continue
            with active_scales(uniform_scales(row.adapters)):
                out.append(self._forward(row, self.caches[row.key]))
        return out

    def _forward(self, row: Row, cache: list[Any]) -> Forwarded:
        if row.media is not None:
            x = row.tokens if isinstance(row.tokens, mx.array) else mx.array(list(row.tokens), dtype=mx.int32)
            logits = media_logits(self.model, x, row.media, cache, want=bool(row.wanted))
            mx.async_eval([c.state for c in cache] if logits is None else (logits, [c.state for c in cache]))
            return Forwarded(None if logits is None else logits[None])
        if row.features is not None:
            logits, part = chunk_with_features(self.model, row.tokens, cache, row.features)
            return Forwarded(logits[None], part.compact())
        x = row.tokens if isinstance(row.tokens, mx.array) else mx.array(list(row.tokens), dtype=mx.int32)
        if row.wanted:
            logits = last_position_logits(self.model, x[None], cache)[None]
            mx.async_eval(logits, [c.state for c in cache])
            return Forwarded(logits)
        self.model(x[None], cache=cache)
        mx.async_eval([c.state for c in cache])
        return Forwarded()

    def rewind(self, key: Hashable, n: int) -> None:
        rewind_cache(self.caches[key], n)


def _refuse_media(rows: Sequence[Row], where: str) -> None:
    if any(row.media is not None for row in rows):
        raise ValueError(f"a prompt chunk with images is fed on its own cache, not in {where}")


def run_step(backend: Backend, rows: Sequence[Row]) -> list[RowOutcome]:
    """One step of ``rows`` on ``backend`` (module docstring); an outcome per row, in order. A failed
    forward raises."""
    rows = list(rows)
    outcomes = [RowOutcome(row.key) for row in rows]
    forwarded = backend.forward(rows)
    sampled = [j for j, row in enumerate(rows) if row.sampling is not None and forwarded[j].logits is not None]
    masks = _masks([rows[j].sampling for j in sampled], rows, sampled)  # while the forward runs
    mx.eval([f.logits for f in forwarded if f.logits is not None])
    for j, f in enumerate(forwarded):
        outcomes[j].logits, outcomes[j].features = f.logits, f.features
    _draw(rows, outcomes, sampled, masks)
    _decide([j for j, row in enumerate(rows) if row.verify is not None and row.verify.prep is not None],
            rows, outcomes, backend)
    for j, row in enumerate(rows):
        if row.verify is not None and row.verify.prep is None:
            _own_round(backend, row, outcomes[j])
    return outcomes


def _masks(samplings: list[Sampling], rows: list[Row], sampled: list[int]) -> dict[int, mx.array]:
    """The next-position masks of the constrained sampled rows, by row index, in one call. A matcher
    that fails leaves its row to compute its own (and fail alone) in ``_draw``."""
    constrained = [(j, s.grammar) for j, s in zip(sampled, samplings) if s.grammar is not None and s.forced is None]
    if not constrained:
        return {}
    try:
        masks = fill_masks([(matcher, ()) for _, matcher in constrained])
    except Exception:
        return {}
    return {j: allowed_rows(mask, matcher.vocab_size) for (j, matcher), mask in zip(constrained, masks)}


def _draw(rows: list[Row], outcomes: list[RowOutcome], sampled: list[int], masks: dict[int, mx.array]) -> None:
    """Each sampled row's token: every draw in one pass and one readback."""
    draws = {}
    for j in sampled:
        s, out = rows[j].sampling, outcomes[j]
        if s.forced is not None:
            out.token = int(s.forced)
            continue
        try:
            row_logits = out.logits[-1:]
            allowed = masks.get(j)
            if allowed is None and s.grammar is not None:
                allowed = allowed_rows(s.grammar.masks(), row_logits.shape[-1])
            out.allowed = allowed
            draws[j] = s.draw(row_logits, allowed)
        except Exception as exc:
            out.error = exc
    for j, token in zip(draws, select_draws(list(draws.values()))):
        if isinstance(token, Exception):
            outcomes[j].error = token
        else:
            outcomes[j].token = int(token[0])


def _decide(verifying: list[int], rows: list[Row], outcomes: list[RowOutcome], backend: Backend) -> None:
    """Every verify row's acceptance in one pass and one readback; then each row's rejected tail
    dropped from its cache and its drafter told what the round emitted."""
    if not verifying:
        return
    decisions = []
    for j in verifying:
        v = rows[j].verify
        decisions.append(v.session.decide_row(v.prep, outcomes[j].logits, v.chain, v.sequence))
    for j, decision, result in zip(verifying, decisions, decide_rounds(decisions)):
        out = outcomes[j]
        try:
            if isinstance(result, Exception):
                raise result
            backend.rewind(rows[j].key, len(decision.prep.block) - (result.accepted + 1))
            observe_round(rows[j].verify.session.drafter, decision.prep, decision.sequence, result)
            out.round = result
        except Exception as exc:
            out.error = exc


def _own_round(backend: Backend, row: Row, out: RowOutcome) -> None:
    """A session that verifies on the row's own cache (``Verify`` with no block)."""
    v = row.verify
    try:
        with active_scales(uniform_scales(row.adapters)):  # the target's forwards of the round
            out.round = v.session.round(backend.model, backend.caches[row.key], v.chain, v.sequence, v.room)
        out.features = out.round.kept_features
    except Exception as exc:
        out.error = exc

