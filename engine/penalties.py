"""Repetition penalties over a block of rows: repeat, presence and frequency.

Row ``i`` of a block sees the sequence ``history + appended[:i]``; its penalty window is the
last ``repeat_last_n`` tokens of that sequence (-1: all of it, 0: penalties off). For every
token that occurs ``c > 0`` times in the window (llama.cpp semantics):

* repeat: a positive logit is divided by ``repeat_penalty``, a non-positive one multiplied;
* then ``logit -= c * frequency_penalty + presence_penalty`` (OpenAI-style).

All rows' windows are cut on the host with one NumPy sliding-window view and counted on the
device with one scatter-add, so a verify block costs the same number of ops as one row.
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


def token_counts(history: Sequence[int], appended: Sequence[int], rows: int, vocab: int, last_n: int) -> mx.array:
    """``[rows, vocab]`` float32 occurrence counts of each row's penalty window."""
    windows = block_windows(history, appended, rows, last_n, pad=vocab)
    windows = np.where((windows >= 0) & (windows < vocab), windows, vocab)
    row_ids = np.broadcast_to(np.arange(rows)[:, None], windows.shape)
    counts = mx.zeros((rows, vocab + 1), dtype=mx.float32)
    counts = counts.at[mx.array(row_ids.reshape(-1)), mx.array(windows.reshape(-1))].add(1.0)
    return counts[:, :vocab]


def apply_penalties(logits: mx.array, counts: mx.array, repeat_penalty: float, presence: float, frequency: float) -> mx.array:
    seen = counts > 0
    x = logits
    if repeat_penalty != 1.0:
        x = mx.where(seen, mx.where(x <= 0, x * repeat_penalty, x / repeat_penalty), x)
    if presence != 0.0 or frequency != 0.0:
        x = x - (counts * frequency + seen.astype(mx.float32) * presence)
    return x
