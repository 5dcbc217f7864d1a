"""Recurrent layers under speculation: a forward over a block that can be cut back to any prefix.

A verify round runs the target once over ``[pending, d_0, ..., d_{k-1}]`` and then keeps only the
pending token and the accepted drafts. Attention layers drop the rest by moving their write
offset back (``kv_cache.rewind``). A recurrent layer (mlx-lm's ``ArraysCache``: Qwen3-Next and
Qwen3.5 gated-delta layers, LFM2 short convolutions, Mamba, RWKV, ...) holds one running summary
of everything it has read, which cannot be un-applied. What it needs is its state *as it was after
the kept prefix*, and a :class:`StateTape` records, during that one block forward, what it takes
to produce it. Two ways, chosen per layer:

* **capture** (the layers in ``CAPTURED``: Qwen3-Next and Qwen3.5 gated-delta layers, LFM2 short
  convolutions): the states after every position of the block are read off the forward itself.
  A convolution's state is the last ``n_keep`` rows of its input window, so the state after ``t``
  tokens is a slice of the window the conv child already received. The gated-delta recurrence is
  run one position at a time (mlx-lm's own ``gated_delta_update`` on one-row slices, the very
  call a one-token decode step makes, kernel included), keeping the state after each. No extra
  model work: a slice per layer and a few more, smaller, recurrence calls.
* **replay** (every other recurrent layer): the layer's state list is snapshotted before the
  forward (references to immutable arrays, free) and the call its mixer received is recorded;
  cutting back to ``t`` tokens restores the snapshot and runs the mixer again over the first
  ``t`` rows of the input it saw. Exact, and it works for any mixer, but costs that mixer's
  projections once more over the kept rows.

Why capture where it is possible (measured on this CPU with ``scripts/bench_model_drafters.py
--sections recurrent``: random 512-wide 8-layer Qwen3.5 and LFM2 targets, f32, width-5 verify
forwards after a 180-token context, medians of 41 interleaved pairs, docs/benchmarks.md): against
the plain forward, capture costs 0.97-1.11x (flat in the kept length: slices and smaller recurrence
calls), replay 1.05-1.28x (it re-reads the mixer's weights and redoes its projections over the
kept rows, so it grows with them). Both leave bit-identical states (the bench and the tests check).
On a GPU the captured recurrence launches one small kernel per block row instead of one for the
block, the launches a one-token decode step makes anyway; the projections, which dominate, stay
batched, while replay's extra weight reads would cost there what they cost here.

Exactness: the state after ``t`` kept tokens is the one a forward of exactly those ``t`` tokens
leaves (bitwise, checked by the tests against a fresh forward of the shorter block for ``t >= 2``;
a one-row forward takes another matmul kernel on this CPU, the block-versus-one-token question
below), so after a round the cache is what a forward of the emitted tokens would have built. Whether a block forward
equals one-token forwards at all is the same question as for attention (``exactness_probe``).

A target whose recurrent layers the tape cannot follow (the cache is not per layer, or no child
of the layer receives its cache) is reported by :func:`unsupported_reason`, so speculation on it
is declined with that message rather than failing mid-request.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList, make_prompt_cache

from mlxcel.engine.errors import CacheRewindError

CAPTURE = "capture"
REPLAY = "replay"

# Mixers whose per-position states are read off the forward: (module, class) -> (the conv child whose
# input window is state slot 0, whether slot 1 is mlx-lm's gated-delta recurrence state).
CAPTURED: dict[tuple[str, str], tuple[str, bool]] = {
    ("mlx_lm.models.qwen3_next", "Qwen3NextGatedDeltaNet"): ("conv1d", True),
    ("mlx_lm.models.qwen3_5", "GatedDeltaNet"): ("conv1d", True),
    ("mlx_lm.models.lfm2", "ShortConv"): ("conv", False),
    ("mlx_lm.models.lfm2_moe", "ShortConv"): ("conv", False),
}


def recurrent_layers(cache: Sequence[Any]) -> list[int]:
    """Indices of the layers whose cache holds recurrent state."""
    return [i for i, c in enumerate(cache) if isinstance(c, ArraysCache)]


def has_recurrent_state(cache: Sequence[Any]) -> bool:
    return any(isinstance(c, ArraysCache) or (isinstance(c, CacheList) and has_recurrent_state(c.caches))
               for c in cache)


def _layers(model: Any) -> list[Any]:
    layers = getattr(model, "layers", None)
    if layers is None:
        raise CacheRewindError(f"a {type(model).__module__} model lists no decoder layers to follow")
    return list(layers)


def _children(layer: nn.Module) -> dict[str, nn.Module]:
    return {name: child for name, child in layer.children().items() if isinstance(child, nn.Module)}


class _Tap:
    """Stands in for one child module of a recurrent layer during a forward: calls it and, when it
    is handed the layer's cache, keeps the call (it is the layer's mixer)."""

    def __init__(self, module: nn.Module, record: _LayerRecord):
        self._module = module
        self._record = record

    def __call__(self, *args, **kwargs):
        rec = self._record
        if rec.mixer is None and any(a is rec.cache for a in (*args, *kwargs.values())):
            rec.mixer, rec.args, rec.kwargs = self._module, args, kwargs
        if rec.strategy == CAPTURE and self._module is rec.capture_mixer:
            _TapState.current = rec
            try:
                return self._module(*args, **kwargs)
            finally:
                _TapState.current = None
        return self._module(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


class _ConvTap:
    """Stands in for a captured mixer's convolution: keeps the window it convolves."""

    def __init__(self, module: nn.Module, record: _LayerRecord):
        self._module = module
        self._record = record

    def __call__(self, x, *args, **kwargs):
        self._record.window = x
        return self._module(x, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


class _TapState:
    current: _LayerRecord | None = None  # the captured mixer running now (engine thread only)


@dataclass
class _LayerRecord:
    index: int
    cache: ArraysCache
    snapshot: list[Any]
    strategy: str = REPLAY
    capture_mixer: nn.Module | None = None
    mixer: nn.Module | None = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    window: mx.array | None = None
    states: list[mx.array] = field(default_factory=list)
    width: int = 0


def _stepped(original):
    """mlx-lm's ``gated_delta_update`` run one position at a time, keeping the state after each
    (for the captured mixer running now); a call outside a capture is passed through."""

    def update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kwargs):
        rec = _TapState.current
        if rec is None:
            return original(q, k, v, a, b, A_log, dt_bias, state, mask, **kwargs)
        ys = []
        for t in range(q.shape[1]):
            row = slice(t, t + 1)
            y, state = original(q[:, row], k[:, row], v[:, row], a[:, row], b[:, row], A_log, dt_bias, state,
                                None if mask is None else mask[:, row], **kwargs)
            ys.append(y)
            rec.states.append(state)
        return mx.concatenate(ys, axis=1), state

    update.mlxcel_stepped = True
    return update


class StateTape:
    """What one forward over ``cache`` leaves to cut every recurrent layer back to any prefix of
    the tokens it fed (:meth:`recording` around the forward, then :meth:`rewind_layer` per layer,
    which ``kv_cache.rewind(cache, n, tape=...)`` calls)."""

    def __init__(self, model: Any, cache: list[Any], *, strategy: str | None = None):
        self.model = model
        self.cache = cache
        self.force = strategy  # tests and the bench: every layer CAPTURE (where possible) or REPLAY
        self.records: dict[int, _LayerRecord] = {}
        self.recorded = False

    @classmethod
    def for_cache(cls, model: Any, cache: list[Any], **kwargs) -> StateTape | None:
        """A tape for ``cache``, or None when it holds no recurrent state (nothing to record)."""
        return cls(model, cache, **kwargs) if has_recurrent_state(cache) else None

    def covers(self, c: Any, n: int) -> bool:
        """Whether the recorded forward lets recurrent layer ``c`` drop its last ``n`` tokens."""
        return self.recorded and any(r.cache is c and 0 <= n <= r.width for r in self.records.values())

    @contextmanager
    def recording(self) -> Iterator[StateTape]:
        layers = _layers(self.model)
        if len(layers) != len(self.cache):
            raise CacheRewindError(f"the cache has {len(self.cache)} layers, the model {len(layers)}")
        self.records = {}
        with ExitStack() as undo:
            for i in recurrent_layers(self.cache):
                c = self.cache[i]
                rec = _LayerRecord(i, c, list(c.cache))
                self.records[i] = rec
                self._install(layers[i], rec, undo)
            yield self
        self.recorded = True
        for rec in self.records.values():
            if rec.strategy == REPLAY and rec.mixer is None:
                raise CacheRewindError(f"layer {rec.index}: no part of it was handed its recurrent cache, so its "
                                       "state cannot be replayed")
            rec.width = self._width(rec)

    def _install(self, layer: nn.Module, rec: _LayerRecord, undo: ExitStack) -> None:
        children = _children(layer)
        mixer = next((m for m in children.values() if (type(m).__module__, type(m).__name__) in CAPTURED), None)
        if mixer is not None and self.force != REPLAY:
            conv_name, recurrence = CAPTURED[(type(mixer).__module__, type(mixer).__name__)]
            module = _module_of(mixer)
            if (len(rec.snapshot) == (2 if recurrence else 1) and isinstance(getattr(mixer, conv_name, None), nn.Module)
                    and (not recurrence or callable(getattr(module, "gated_delta_update", None)))):
                rec.strategy, rec.capture_mixer = CAPTURE, mixer
                conv = getattr(mixer, conv_name)
                mixer[conv_name] = _ConvTap(conv, rec)
                undo.callback(mixer.__setitem__, conv_name, conv)
                if recurrence:
                    original = module.gated_delta_update
                    if not getattr(original, "mlxcel_stepped", False):
                        module.gated_delta_update = _stepped(original)
                        undo.callback(setattr, module, "gated_delta_update", original)
        for name, child in children.items():
            layer[name] = _Tap(child, rec)
            undo.callback(layer.__setitem__, name, child)

    @staticmethod
    def _width(rec: _LayerRecord) -> int:
        if rec.strategy == CAPTURE:
            n_keep = int(rec.cache[0].shape[1])
            return int(rec.window.shape[1]) - n_keep if rec.window is not None else 0
        x = rec.args[0] if rec.args else next(iter(rec.kwargs.values()))
        return int(x.shape[1])

    def rewind_layer(self, c: ArraysCache, n: int) -> None:
        """Set recurrent layer ``c`` to its state after all but the last ``n`` tokens of the forward."""
        rec = next(r for r in self.records.values() if r.cache is c)
        if not 0 <= n <= rec.width:
            raise CacheRewindError(f"layer {rec.index}: cannot cut {n} of the {rec.width} tokens its forward fed")
        if n == 0:
            return
        kept = rec.width - n
        if kept == 0:
            c.cache = list(rec.snapshot)
            return
        if rec.strategy == CAPTURE:
            n_keep = int(c.cache[0].shape[1])
            window = mx.contiguous(rec.window[:, kept:kept + n_keep, :])
            c.cache = [window, rec.states[kept - 1]] if len(c.cache) == 2 else [window]
            return
        c.cache = list(rec.snapshot)
        args, kwargs = _cut_call(rec.args, rec.kwargs, rec.width, kept, c)
        rec.mixer(*args, **kwargs)


def _module_of(mixer: nn.Module):
    return sys.modules[type(mixer).__module__]


def _cut_call(args: tuple, kwargs: dict, width: int, kept: int, cache: Any) -> tuple[tuple, dict]:
    """The recorded mixer call with its inputs cut to their first ``kept`` rows: the hidden states
    ``[B, width, ...]`` and any ``[B, width]`` mask."""

    def cut(a):
        if a is cache or not isinstance(a, mx.array) or a.ndim < 2 or a.shape[1] != width:
            return a
        return a[:, :kept]

    return tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}


def unsupported_reason(model: Any, make_cache=None) -> str | None:
    """Why speculative verify rounds cannot restore this target's recurrent state, or None when
    they can (or it has none). Found by one two-token forward through a tape on a fresh cache."""
    cache = make_cache() if make_cache is not None else make_prompt_cache(model)
    if not has_recurrent_state(cache):
        return None
    if any(isinstance(c, CacheList) and has_recurrent_state(c.caches) for c in cache):
        return ("its layers keep recurrent state inside combined per-layer caches (CacheList), which a verify "
                "round cannot cut back to the accepted tokens")
    tape = StateTape(model, cache)
    try:
        model(mx.array([[0]]), cache=cache)
        with tape.recording():
            out = model(mx.array([[1, 2]]), cache=cache)
        mx.eval(out)
        for i in recurrent_layers(cache):
            tape.rewind_layer(cache[i], 1)
    except CacheRewindError as exc:
        return f"its recurrent state cannot be restored after a verify round ({exc})"
    return None


class StateMarks:
    """The recurrent layers' states at chosen lengths of one sequence's cache: what a drafter that
    feeds its own cache (a draft model) keeps to go back to any length it marked. Marking is free
    (the states are immutable arrays, held by reference), so a drafter marks after every forward;
    ``kv_cache.rewind(cache, n, tape=marks)`` then restores the mark at the new length."""

    def __init__(self, cache: list[Any]):
        self.cache = cache
        self.layers = recurrent_layers(cache)
        self.length = 0
        self.marks: dict[int, list[list[Any]]] = {}

    def mark(self, length: int) -> None:
        """The cache now holds ``length`` tokens: remember its recurrent states there."""
        self.length = length
        self.marks[length] = [list(self.cache[i].cache) for i in self.layers]

    def covers(self, c: Any, n: int) -> bool:
        return (self.length - n) in self.marks and any(self.cache[i] is c for i in self.layers)

    def rewind_layer(self, c: Any, n: int) -> None:
        j = next(j for j, i in enumerate(self.layers) if self.cache[i] is c)
        c.cache = list(self.marks[self.length - n][j])

    def rewound(self, n: int) -> None:
        """After ``kv_cache.rewind(cache, n, tape=self)``: the cache is ``n`` tokens shorter, and what it
        holds now is committed, so only the mark at its length is worth keeping."""
        self.length -= n
        self.marks = {self.length: self.marks[self.length]} if self.length in self.marks else {}
