"""Candidate ordering and the truncation filters: top-k, typical-p, top-p, min-p.

The filters work on a *candidate block*: ``values [N, K]`` (adjusted logits sorted from the
most to the least likely, ties broken by the lower token id), ``ids [N, K]`` (their token ids)
and ``alive [N, K]`` (which candidates are still in the running). A filter only ever clears
``alive``; the order never changes, so every stage sees the candidates in the same order and
the result does not depend on how a sort treats ties.

Each filter follows llama.cpp's definition (its sampler order is top-k, typical, top-p, min-p)
and works on the *untempered* distribution: softmax of the surviving adjusted logits.

Why the int64 keys: a float sort gives no promise about which of two equal logits comes
first, and top-k with a tie at the k-th value has to pick one. Packing an order-preserving
integer image of the float (high 32 bits) with the reversed token id (low 32 bits) makes every
key distinct, so top-k / sort / argsort are deterministic on every backend and a row gives the
same candidates whether it is sampled alone or inside a verify block.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

NEG_INF = float("-inf")


@dataclass
class Candidates:
    values: mx.array  # [N, K] float32, descending
    ids: mx.array  # [N, K] int32 token ids
    alive: mx.array  # [N, K] bool


def ordered_bits(x: mx.array) -> mx.array:
    """An int32 image of float32 ``x`` that sorts like ``x`` (-0.0 and 0.0 map together)."""
    x = mx.where(x == 0, 0.0, x.astype(mx.float32))
    bits = x.view(mx.int32)
    return mx.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _packed(high: mx.array, low: mx.array) -> mx.array:
    return high.astype(mx.int64) * (1 << 32) + low.astype(mx.int64)


def top_candidates(logits: mx.array, k: int) -> Candidates:
    """The ``k`` most likely tokens of each row (all of them for ``k <= 0`` or ``k >= V``),
    sorted by logit descending, ties by token id ascending."""
    n, v = logits.shape
    key = _packed(ordered_bits(logits), (v - 1) - mx.arange(v, dtype=mx.int32))
    if 0 < k < v:
        key = mx.topk(key, k, axis=-1)
    key = mx.sort(key, axis=-1)[:, ::-1]
    ids = ((v - 1) - (key & 0xFFFFFFFF)).astype(mx.int32)
    values = mx.take_along_axis(logits, ids, axis=-1)
    return Candidates(values, ids, mx.ones(values.shape, dtype=mx.bool_))


def masked_softmax(values: mx.array, alive: mx.array) -> mx.array:
    """Probabilities over the alive candidates (0 elsewhere)."""
    return mx.softmax(mx.where(alive, values, NEG_INF), axis=-1, precise=True)


def alive_rank(alive: mx.array) -> mx.array:
    """For each candidate, how many alive candidates come before it."""
    return mx.cumsum(alive.astype(mx.int32), axis=-1, inclusive=False)


def typical_filter(c: Candidates, typical_p: float | mx.array, min_keep: int | mx.array) -> mx.array:
    """Locally typical sampling: keep the candidates whose surprise ``-log p`` is closest to
    the row's entropy, in that order, until their mass first exceeds ``typical_p``.

    Each filter takes its values as scalars or as ``[N, 1]`` columns (one per row), and
    ``min_keep`` at least 1: the fewest candidates it leaves."""
    p = masked_softmax(c.values, c.alive)
    logp = mx.log(p)
    entropy = -mx.sum(mx.where(p > 0, p * logp, 0.0), axis=-1, keepdims=True)
    shifted = mx.where(c.alive & (p > 0), mx.abs(-logp - entropy), float("inf"))
    k = shifted.shape[-1]
    order = mx.argsort(_packed(ordered_bits(shifted), mx.arange(k, dtype=mx.int32)), axis=-1)
    before = mx.cumsum(mx.take_along_axis(p, order, axis=-1), axis=-1, inclusive=False)
    keep_sorted = (before <= typical_p) | (mx.arange(k) < min_keep)
    keep = mx.put_along_axis(mx.zeros(keep_sorted.shape, dtype=mx.bool_), order, keep_sorted, axis=-1)
    return c.alive & keep


def top_p_filter(c: Candidates, top_p: float | mx.array, min_keep: int | mx.array) -> mx.array:
    """Nucleus: the shortest most-likely prefix whose mass reaches ``top_p``."""
    p = masked_softmax(c.values, c.alive)
    before = mx.cumsum(p, axis=-1, inclusive=False)
    keep = (before < top_p) | (alive_rank(c.alive) < min_keep)
    return c.alive & keep


def min_p_filter(c: Candidates, log_min_p: float | mx.array, min_keep: int | mx.array) -> mx.array:
    """Keep tokens with ``p >= min_p * p_max``, compared as logits:
    ``logit >= max_logit + log(min_p)`` (``log_min_p``: ``math.log(min_p)``, or a column of them)."""
    top = mx.max(mx.where(c.alive, c.values, NEG_INF), axis=-1, keepdims=True)
    threshold = top + log_min_p
    keep = (c.values >= threshold) | (alive_rank(c.alive) < min_keep)
    return c.alive & keep
