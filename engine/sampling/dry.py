"""DRY ("don't repeat yourself"): penalise the token that would extend a repeated suffix.

Semantics (llama.cpp's DRY sampler, reimplemented here):

* The window is the last ``dry_penalty_last_n`` tokens of the row's sequence (-1: all of it;
  0: off). With ``w`` the window and ``n = len(w)``, nothing happens when ``n <= allowed_length``.
* Sequence breakers cap how far back a repetition may reach: scanning from the newest token
  backwards, the first breaker occurrence (a head token followed by its tail tokens) that ends
  ``i`` tokens from the end sets ``limit = i - len(tail)``; no breaker: ``limit = n``. A limit
  below ``allowed_length`` switches DRY off for the row.
* For every earlier position ``j`` of the window, ``m_j`` is the length of the longest common
  suffix of ``w[: j + 1]`` and ``w`` (capped at ``limit``). When ``m_j >= allowed_length`` the
  token ``w[j + 1]`` would extend that repetition; it is penalised by
  ``multiplier * base ** (max_j m_j - allowed_length)`` (the exponent clamped so the power stays
  finite in float32). Tokens that are single-token breakers are never penalised.

Breakers come as strings (llama-server's ``dry_sequence_breakers``) and become token
sequences once per tokenizer: every vocab token whose text contains the string is a
single-token breaker; a token whose text ends with a proper prefix of the string becomes a head
whose tail is the tokenization of the rest. That pass reads the whole vocabulary in Python, so
its result is cached per (tokenizer, strings); the per-step work below is NumPy over the window.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

MAX_BREAKER_CHARS = 40
MAX_BREAKER_TAIL = 20
FLOAT32_MAX_LOG = 88.7228391


@dataclass(frozen=True)
class DryBreakers:
    """Token-level sequence breakers: head token -> tails (tuples of the tokens after it)."""

    tails: Mapping[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)

    @property
    def single_tokens(self) -> frozenset[int]:
        return frozenset(h for h, ts in self.tails.items() if () in ts)

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]]) -> DryBreakers:
        tails: dict[int, list[tuple[int, ...]]] = {}
        for seq in sequences:
            if len(seq) == 0:
                continue
            bucket = tails.setdefault(int(seq[0]), [])
            tail = tuple(int(t) for t in seq[1:])
            if tail not in bucket:
                bucket.append(tail)
        return cls({h: tuple(ts) for h, ts in tails.items()})


_VOCAB_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BREAKERS: dict[tuple[int, tuple[str, ...]], tuple[weakref.ref, DryBreakers]] = {}


def _hf(tokenizer):
    return getattr(tokenizer, "_tokenizer", tokenizer)


def vocab_texts(tokenizer, vocab_size: int) -> list[str]:
    """The text of every token id (special tokens included), cached per tokenizer."""
    cached = _VOCAB_TEXTS.get(tokenizer)
    if cached is not None and len(cached) >= vocab_size:
        return cached[:vocab_size]
    hf = _hf(tokenizer)
    try:
        n = min(vocab_size, len(hf))
    except TypeError:
        n = vocab_size
    ids = [[i] for i in range(n)]
    if hasattr(hf, "batch_decode"):
        texts = list(hf.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
    else:
        texts = [hf.decode(i) for i in ids]
    texts += [""] * (vocab_size - len(texts))
    try:
        _VOCAB_TEXTS[tokenizer] = texts
    except TypeError:
        pass
    return texts


def breakers_from_strings(tokenizer, strings: Sequence[str], vocab_size: int) -> DryBreakers:
    """Token-level breakers for llama-server's string breakers (see the module docstring)."""
    strings = tuple(s[:MAX_BREAKER_CHARS] for s in strings if s)
    cache_key = (id(tokenizer), strings)
    hit = _BREAKERS.get(cache_key)
    if hit is not None and hit[0]() is tokenizer:
        return hit[1]
    texts = vocab_texts(tokenizer, vocab_size)
    hf = _hf(tokenizer)
    sequences: list[tuple[int, ...]] = []
    for s in strings:
        for tid, word in enumerate(texts):
            if not word or s[0] not in word:
                continue
            if s in word:
                sequences.append((tid,))
                continue
            pos = word.find(s[0])
            while pos != -1:
                overlap = len(word) - pos  # < len(s): s is not contained in word
                if s.startswith(word[pos:]):
                    rest = hf.encode(s[overlap:], add_special_tokens=False)[:MAX_BREAKER_TAIL]
                    sequences.append((tid, *rest))
                pos = word.find(s[0], pos + 1)
    result = DryBreakers.from_sequences(sequences)
    try:
        _BREAKERS[cache_key] = (weakref.ref(tokenizer), result)
    except TypeError:
        pass
    return result


def repetition_limit(rev: np.ndarray, breakers: DryBreakers) -> int:
    """How many of the newest tokens a repetition may span (``rev`` is the window newest-first)."""
    n = len(rev)
    if not breakers.tails:
        return n
    heads = np.fromiter(breakers.tails.keys(), dtype=np.int64)
    for i in np.flatnonzero(np.isin(rev, heads)).tolist():
        longest = -1
        for tail in breakers.tails[int(rev[i])]:
            length = len(tail)
            if longest < length <= i and all(tail[o] == rev[i - o - 1] for o in range(length)):
                longest = length
        if longest >= 0:
            return i - longest
    return n


def suffix_matches(rev: np.ndarray, limit: int) -> np.ndarray:
    """``z[k]`` = length of the common prefix of ``rev`` and ``rev[k:]`` (capped at ``limit``),
    i.e. how long the repetition ending ``k`` tokens before the newest one is. ``z[0] = 0``."""
    n = len(rev)
    z = np.zeros(n, dtype=np.int64)
    live = np.arange(1, n)
    m = 0
    while live.size and m < limit:
        live = live[live + m < n]
        live = live[rev[live + m] == rev[m]]
        m += 1
        z[live] = m
    return z


def dry_penalties(window: np.ndarray, breakers: DryBreakers, multiplier: float, base: float,
                  allowed_length: int) -> dict[int, float]:
    """token -> amount to subtract from its logit, for one row's window (oldest first)."""
    n = len(window)
    if n <= allowed_length:
        return {}
    rev = window[::-1]
    limit = repetition_limit(rev, breakers)
    if limit < allowed_length:
        return {}
    z = suffix_matches(rev, limit)
    ks = np.flatnonzero(z >= allowed_length)
    if ks.size == 0:
        return {}
    longest: dict[int, int] = {}
    for tok, length in zip(rev[ks - 1].tolist(), z[ks].tolist()):
        if length > longest.get(tok, -1):
            longest[tok] = length
    max_exponent = int(FLOAT32_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    single = breakers.single_tokens
    out = {}
    for tok, length in longest.items():
        if tok in single:
            continue
        exponent = length - allowed_length
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        out[tok] = float(multiplier * base**exponent)
    return out


def dry_enabled(multiplier: float, base: float, last_n: int) -> bool:
    return multiplier != 0.0 and base >= 1.0 and last_n != 0


def apply_dry(logits: mx.array, history: Sequence[int], appended: Sequence[int], breakers: DryBreakers,
              multiplier: float, base: float, allowed_length: int, last_n: int) -> mx.array:
    """Subtract each row's DRY penalties (row ``i`` sees ``history + appended[:i]``)."""
    rows, vocab = logits.shape
    seq = np.asarray(list(history) + list(appended[: max(rows - 1, 0)]), dtype=np.int64)
    base_len = len(history)
    r_idx, t_idx, amounts = [], [], []
    for i in range(rows):
        end = base_len + i
        start = 0 if last_n < 0 else max(0, end - last_n)
        for tok, amount in dry_penalties(seq[start:end], breakers, multiplier, base, allowed_length).items():
            if 0 <= tok < vocab:
                r_idx.append(i)
                t_idx.append(tok)
                amounts.append(amount)
    if not amounts:
        return logits
    return logits.at[mx.array(r_idx), mx.array(t_idx)].subtract(mx.array(amounts, dtype=mx.float32))
