"""Many rows' tokens in one pass: every row keeps its own chain, history, seed and mask, and all of
them are evaluated together and read back once.

A :class:`Draw` is one block of rows of one sequence, exactly what ``SamplerChain.select`` is
given: ``logits [N, V]``, the history, the drafts appended after it (row ``i`` sees
``history + appended[:i]``), the seed and the absolute position of row 0, and the grammar's mask
rows. A decoding row is a block of one; a verify round's block is ``[pending, *drafts]``.

:func:`pick_draws` builds every draw's tokens as lazy arrays, in three steps:

1. each draw's adjusted logits (``SamplerChain.adjusted_logits``: bias, penalties and DRY over its
   own history, its mask), lazily, one draw at a time (those stages read host-side histories);
2. the rows are grouped by what their chain does next (``SamplerChain.shape``): an argmax row
   (a greedy chain, or a draw asking for the argmax whatever the chain) takes its argmax; the
   sampled rows of one shape are stacked and go through one graph of steps 3-5
   (``chain.distribution_rows``), each row with its own temperature / top-p / min-p / ...
   column (``StageValues``), its own XTC coin and its own position key for the draw (on a CPU
   a group is cut into graphs of a few rows, ``CPU_STACK_ELEMENTS``: there a tall graph's
   intermediates leave the caches);
3. the stacked results are split back into the draws.

Every row therefore runs the very ops ``SamplerChain.select`` runs for it alone, on the same
values and the same keys, only with other rows stacked beside it: row-wise ops (argmax, sort,
softmax, cumulative sums) give a row the same bits whatever its neighbours, so each row's token is
the one it gets alone (tests/engine/sampling/test_batch_select.py checks it, zero tolerance).

:func:`read_together` is the one host readback: every row's lazy integer arrays in one
``mx.eval`` and one copy to the host. :func:`select_draws` is both together. A draw whose own
stages fail while its graph is built fails alone; when the shared evaluation itself fails, each
draw is evaluated alone so the one at fault fails alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel.engine.platform.argmax import argmax_last
from mlxcel.engine.sampling.chain import SamplerChain, StageValues, distribution_rows, draw_rows, position_keys
from mlxcel.engine.sampling.xtc import xtc_coins


@dataclass
class Draw:
    """One block of rows to choose tokens for: ``SamplerChain.select``'s arguments. ``argmax``:
    the argmax of the adjusted logits whatever the chain's temperature (argmax-against-argmax)."""

    chain: SamplerChain
    logits: mx.array  # [N, V] (or [V]: one row)
    history: Sequence[int]
    appended: Sequence[int] = ()
    seed: int = 0
    first_position: int = 0
    allowed: mx.array | None = None  # [N, V] bool: the grammar's mask rows
    argmax: bool = False


def _adjusted(draw: Draw) -> mx.array:
    return draw.chain.adjusted_logits(draw.logits, draw.history, draw.appended, draw.allowed)


def _split(stacked: mx.array, counts: Sequence[int]) -> list[mx.array]:
    out, start = [], 0
    for n in counts:
        out.append(stacked[start:start + n])
        start += n
    return out


def _stack(arrays: Sequence[mx.array]) -> mx.array:
    return arrays[0] if len(arrays) == 1 else mx.concatenate(list(arrays), axis=0)


# How many logits one stacked graph may hold on a CPU (rows x vocabulary): beyond a few rows of a
# large vocabulary the intermediates (int64 sort keys, cumulative sums) leave the caches and a
# stacked graph runs slower than the rows one by one (docs/benchmarks.md, issue 17). A GPU stacks
# every row of a shape: there each graph costs its kernel launches.
CPU_STACK_ELEMENTS = 1 << 19
stack_elements: int | None = None  # None: CPU_STACK_ELEMENTS on a CPU, no limit elsewhere


def _chunks(members: list, vocab: int) -> list[list]:
    """``members`` (draw index, adjusted rows) cut into runs of at most the stacking limit's rows
    (a draw is never cut)."""
    limit = stack_elements
    if limit is None:
        limit = CPU_STACK_ELEMENTS if mx.default_device() == mx.cpu else 0
    if limit <= 0:
        return [members]
    most = max(1, limit // max(vocab, 1))
    out, run, rows = [], [], 0
    for m in members:
        n = m[1].shape[0]
        if run and rows + n > most:
            out.append(run)
            run, rows = [], 0
        run.append(m)
        rows += n
    if run:
        out.append(run)
    return out


def _group(draws: Sequence[Draw], out: list, by_argmax: bool) -> tuple[list, dict]:
    """Each draw's adjusted logits, grouped: the argmax rows (when ``by_argmax``) and the sampled
    rows by shape. A draw whose own stages fail gets its exception in ``out``."""
    argmax: list[tuple[int, mx.array]] = []
    sampled: dict = {}
    for i, draw in enumerate(draws):
        try:
            x = _adjusted(draw)
        except Exception as exc:  # this draw's own stages (penalties, DRY, its mask) failed: it alone
            out[i] = exc
            continue
        if by_argmax and (draw.argmax or draw.chain.greedy):
            argmax.append((i, x))
        else:
            sampled.setdefault(draw.chain.shape, []).append((i, x))
    return argmax, sampled


def _probs(draws: Sequence[Draw], shape, members: list) -> tuple[mx.array, list[int]]:
    """p of the stacked rows of ``members`` (one shape): ``[sum N, V]`` and each draw's row count."""
    counts = [x.shape[0] for _, x in members]
    blocks = [(draws[i].chain, n) for (i, _), n in zip(members, counts)]
    coins = None
    if shape.xtc:
        coins = _stack([xtc_coins(draws[i].seed, draws[i].first_position, n) for (i, _), n in zip(members, counts)])
    return distribution_rows(_stack([x for _, x in members]), shape, StageValues.of(blocks, shape), coins), counts


def pick_draws(draws: Sequence[Draw]) -> list[mx.array | Exception]:
    """Per draw, its ``[N]`` tokens as a lazy int32 array, or the exception its own stages raised
    while the graph was built (see the module docstring)."""
    out: list = [None] * len(draws)
    argmax, sampled = _group(draws, out, by_argmax=True)
    for i, x in argmax:  # an argmax needs no stacking: one reduction per row, no copy
        out[i] = argmax_last(x).astype(mx.int32)
    def tokens(shape, run):
        probs, counts = _probs(draws, shape, run)
        keys = _stack([position_keys(draws[i].seed, draws[i].first_position, n) for (i, _), n in zip(run, counts)])
        return _split(draw_rows(probs, keys), counts)

    for shape, members in sampled.items():
        for run in _chunks(members, members[0][1].shape[-1]):
            _build(run, lambda r, shape=shape: tokens(shape, r), out)
    return out


def _build(run: list, build: Callable[[list], list[mx.array]], out: list) -> None:
    """``build`` over the stacked ``run``, its parts into ``out``; when stacking fails (rows that
    cannot share a graph), each member is built alone and the one at fault gets its exception."""
    try:
        parts = build(run)
    except Exception:
        for m in run:
            try:
                (out[m[0]],) = build([m])
            except Exception as exc:
                out[m[0]] = exc
        return
    for (i, _), part in zip(run, parts):
        out[i] = part


def distribution_draws(draws: Sequence[Draw]) -> list[mx.array | Exception]:
    """Per draw, p ``[N, V]`` (``SamplerChain.distribution``) lazily, the rows of one shape in one
    graph; or the exception its own stages raised."""
    out: list = [None] * len(draws)
    _, groups = _group(draws, out, by_argmax=False)
    def probs(shape, run):
        p, counts = _probs(draws, shape, run)
        return _split(p, counts)

    for shape, members in groups.items():
        for run in _chunks(members, members[0][1].shape[-1]):
            _build(run, lambda r, shape=shape: probs(shape, r), out)
    return out


def read_together(rows: Sequence[Sequence[mx.array] | Exception],
                  alone: Callable[[int], Sequence[mx.array]] | None = None) -> list[list | Exception]:
    """Every row's lazy integer (or boolean) 0-d / 1-d arrays evaluated in one ``mx.eval`` and read back in
    one host copy; per row, its arrays as host values (``tolist``), in order. A row given as an
    exception stays one. When the shared evaluation fails, each row is evaluated alone (its arrays
    rebuilt by ``alone(i)``, since rows stacked in one graph share its failure) and the rows that
    fail get their own exception."""
    live = [(i, r) for i, r in enumerate(rows) if not isinstance(r, Exception)]
    out: list = [r if isinstance(r, Exception) else None for r in rows]
    flat = [a for _, r in live for a in r]
    if not flat:
        for i, r in live:
            out[i] = []
        return out
    try:
        values = _read(flat)
    except Exception:
        for i, r in live:
            try:
                arrays = list(alone(i) if alone is not None else r)
                out[i] = _read(arrays) if arrays else []
            except Exception as exc:
                out[i] = exc
        return out
    at = 0
    for i, r in live:
        out[i] = values[at:at + len(r)]
        at += len(r)
    return out


def _read(arrays: list[mx.array]) -> list:
    """One evaluation, one readback: the arrays (0-d or 1-d) flattened into one int32 vector,
    copied to the host once, and cut back into one list (an int for a 0-d array) each."""
    if any(a.ndim > 1 for a in arrays):
        raise ValueError("read_together reads 0-d and 1-d arrays")
    for a in arrays:  # queued graph by graph (no wait): each one's intermediates stay in the caches
        mx.async_eval(a)
    flat = _stack([a.astype(mx.int32).reshape(-1) for a in arrays])
    host = flat.tolist()
    out, at = [], 0
    for a in arrays:
        n = a.size
        out.append(host[at] if a.ndim == 0 else host[at:at + n])
        at += n
    return out


def select_draws(draws: Sequence[Draw]) -> list[list[int] | Exception]:
    """Per draw, its tokens (``SamplerChain.select`` for that draw alone), all in one pass and one
    readback; a draw that fails gets its exception (the others are unaffected)."""
    picks = pick_draws(draws)
    values = read_together([p if isinstance(p, Exception) else [p] for p in picks], lambda i: _alone(draws[i]))
    return [v if isinstance(v, Exception) else v[0] for v in values]


def _alone(draw: Draw) -> list[mx.array]:
    (pick,) = pick_draws([draw])
    if isinstance(pick, Exception):
        raise pick
    return [pick]
