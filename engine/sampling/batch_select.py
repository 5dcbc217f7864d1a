"""Many rows' tokens in one pass: every row keeps its own chain, history, seed and mask, and all of
them are evaluated together and read back once.

A :class:`Draw` is one block of rows of one sequence, exactly what ``SamplerChain.select`` is
given: ``logits [N, V]``, the history, the drafts appended after it (row ``i`` sees
``history + appended[:i]``), the seed and the absolute position of row 0, and the grammar's mask
rows. A decoding row is a block of one; a verify round's block is ``[pending, *drafts]``.

:func:`pick_draws` builds every draw's tokens as lazy arrays, in three steps:

1. each draw's adjusted logits (``SamplerChain.adjusted_logits``: bias, penalties and DRY over its
   own history, its mask), lazily, one draw at a time (those stages read host-side histories);
2. the rows are grouped by what their chain does next (``SamplerChain.shape``): all argmax rows
   (greedy chains, and draws asking for the argmax whatever the chain) are stacked and take one
   argmax; the sampled rows of one shape are stacked and go through one graph of steps 3-5
   (``chain.distribution_rows``), each row with its own temperature / top-p / min-p / ...
   column (``StageValues``), its own XTC coin and its own position key for the draw;
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


def pick_draws(draws: Sequence[Draw]) -> list[mx.array | Exception]:
    """Per draw, its ``[N]`` tokens as a lazy int32 array, or the exception its own stages raised
    while the graph was built (see the module docstring)."""
    out: list[mx.array | Exception | None] = [None] * len(draws)
    greedy: list[tuple[int, mx.array]] = []
    sampled: dict = {}
    for i, draw in enumerate(draws):
        try:
            x = _adjusted(draw)
        except Exception as exc:  # this draw's own stages (penalties, DRY, its mask) failed: it alone
            out[i] = exc
            continue
        if draw.argmax or draw.chain.greedy:
            greedy.append((i, x))
        else:
            sampled.setdefault(draw.chain.shape, []).append((i, x))
    if greedy:
        tokens = _stack([x for _, x in greedy]).argmax(axis=-1).astype(mx.int32)
        for (i, _), part in zip(greedy, _split(tokens, [x.shape[0] for _, x in greedy])):
            out[i] = part
    for shape, members in sampled.items():
        counts = [x.shape[0] for _, x in members]
        blocks = [(draws[i].chain, n) for (i, _), n in zip(members, counts)]
        coins = None
        if shape.xtc:
            coins = _stack([xtc_coins(draws[i].seed, draws[i].first_position, n) for (i, _), n in zip(members, counts)])
        probs = distribution_rows(_stack([x for _, x in members]), shape, StageValues.of(blocks, shape), coins)
        keys = _stack([position_keys(draws[i].seed, draws[i].first_position, n) for (i, _), n in zip(members, counts)])
        for (i, _), part in zip(members, _split(draw_rows(probs, keys), counts)):
            out[i] = part
    return out  # type: ignore[return-value]


def distribution_draws(draws: Sequence[Draw]) -> list[mx.array | Exception]:
    """Per draw, p ``[N, V]`` (``SamplerChain.distribution``) lazily, the rows of one shape in one
    graph; or the exception its own stages raised."""
    out: list[mx.array | Exception | None] = [None] * len(draws)
    groups: dict = {}
    for i, draw in enumerate(draws):
        try:
            groups.setdefault(draw.chain.shape, []).append((i, _adjusted(draw)))
        except Exception as exc:
            out[i] = exc
    for shape, members in groups.items():
        counts = [x.shape[0] for _, x in members]
        blocks = [(draws[i].chain, n) for (i, _), n in zip(members, counts)]
        coins = None
        if shape.xtc:
            coins = _stack([xtc_coins(draws[i].seed, draws[i].first_position, n) for (i, _), n in zip(members, counts)])
        probs = distribution_rows(_stack([x for _, x in members]), shape, StageValues.of(blocks, shape), coins)
        for (i, _), part in zip(members, _split(probs, counts)):
            out[i] = part
    return out  # type: ignore[return-value]


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
