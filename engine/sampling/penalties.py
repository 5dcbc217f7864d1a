"""Repetition penalties over a block of rows: repeat, presence and frequency.

Row ``i`` of a block sees the sequence ``history + appended[:i]``; its penalty window is the
last ``repeat_last_n`` tokens of that sequence (-1: all of it, 0: penalties off). For every
token that occurs ``c > 0`` times in the window (llama.cpp semantics):

* repeat: a positive logit is divided by ``repeat_penalty``, a non-positive one multiplied;
* then ``logit -= c * frequency_penalty + presence_penalty`` (OpenAI-style).

All rows' windows are cut and counted on the host (NumPy, over at most ``repeat_last_n``
tokens a row); the device gathers the logits of the tokens that occur, penalises them and
scatters them back, so a verify block costs the same number of device ops as one row.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np


def block_windows(history: Sequence[int], appended: Sequence[int], rows: int, last_n: int, pad: int) -> np.ndarray:
    """``[rows, W]`` token windows: row ``i`` is the last ``last_n`` tokens (all for -1) of
    ``history + appended[:i]``, left-padded with ``pad``."""
    if last_n < 0:
        head = np.asarray(history, dtype=np.int64)
        width = max(len(head) + rows - 1, 1)
    else:
        head = np.asarray(history[-last_n:] if len(history) > last_n else history, dtype=np.int64)
        width = last_n
    tail = np.asarray(list(appended[: max(rows - 1, 0)]), dtype=np.int64)
    seq = np.concatenate([np.full(width, pad, dtype=np.int64), head, tail])
    windows = np.lib.stride_tricks.sliding_window_view(seq, width)
    return windows[len(head) : len(head) + rows]


def penalties_enabled(repeat_last_n: int, repeat_penalty: float, presence: float, frequency: float) -> bool:
    return repeat_last_n != 0 and (repeat_penalty != 1.0 or presence != 0.0 or frequency != 0.0)


def window_counts(history: Sequence[int], appended: Sequence[int], rows: int, vocab: int,
                  last_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nonzero counts of every row's penalty window as ``(row, token, count)`` arrays.

    Only the tokens that occur are touched (a window holds at most ``last_n`` distinct tokens),
    so the device work is one gather and one scatter of that size, not passes over ``[N, V]``.
    The whole-history window (-1) counts the shared history once and adds each row's drafts."""
    if last_n < 0:
        base_tok, base_cnt = np.unique(np.asarray(history, dtype=np.int64), return_counts=True)
        extra = np.asarray(list(appended[: max(rows - 1, 0)]), dtype=np.int64)
        parts = []
        for i in range(rows):
            tok, inv = np.unique(np.concatenate([base_tok, extra[:i]]), return_inverse=True)
            cnt = np.bincount(inv, weights=np.concatenate([base_cnt, np.ones(i)]))
            parts.append((np.full(len(tok), i), tok, cnt))
        r, t, c = (np.concatenate(x) for x in zip(*parts))
    else:
        windows = block_windows(history, appended, rows, last_n, pad=-1)
        keys = (np.arange(rows)[:, None] * (vocab + 1) + (windows + 1)).reshape(-1)
        keys, c = np.unique(keys, return_counts=True)
        r, t = keys // (vocab + 1), keys % (vocab + 1) - 1
    ok = (t >= 0) & (t < vocab)
    return r[ok], t[ok], c[ok].astype(np.float32)


def apply_penalties(logits: mx.array, history: Sequence[int], appended: Sequence[int], last_n: int,
                    repeat_penalty: float, presence: float, frequency: float) -> mx.array:
    rows, vocab = logits.shape
    r, t, c = window_counts(history, appended, rows, vocab, last_n)
    if len(r) == 0:
        return logits
    r, t, counts = mx.array(r.astype(np.int32)), mx.array(t.astype(np.int32)), mx.array(c)
    x = logits[r, t]
    if repeat_penalty != 1.0:
        x = mx.where(x <= 0, x * repeat_penalty, x / repeat_penalty)
    if presence != 0.0 or frequency != 0.0:
        x = x - (counts * frequency + presence)
    out = mx.array(logits)
    out[r, t] = x
    return out
