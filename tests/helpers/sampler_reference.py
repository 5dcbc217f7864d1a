"""A plain NumPy, one-row-at-a-time reference of the sampler chain, for tests.

Written the way llama.cpp's samplers read: a candidate *list* per row that each stage sorts,
cuts and reorders, with the loops spelled out. It shares no code with ``engine`` (the engine
works on masks over a fixed order, vectorised over a block), so agreement between the two is
evidence about both. Float32 throughout, like the engine.

Conventions the engine also follows (llama.cpp leaves them to its sort): equal logits are
ordered by the lower token id; typical-p orders equal scores by their logit order; the entropy
treats ``0 * log 0`` as 0.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

F32 = np.float32
NEG_INF = F32(-np.inf)


def softmax32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=F32)
    e = np.exp(x - x.max()).astype(F32)
    return (e / e.sum(dtype=F32)).astype(F32)


# -- breakers --------------------------------------------------------------------------------

def reference_breakers(texts: list[str], encode, strings) -> dict[int, set[tuple[int, ...]]]:
    """head -> set of tails, by brute force over every suffix of every token text."""
    out: dict[int, set[tuple[int, ...]]] = {}
    for s in strings:
        s = s[:40]
        if not s:
            continue
        for tid, word in enumerate(texts):
            if s in word:
                out.setdefault(tid, set()).add(())
                continue
            for pos in range(len(word)):
                suffix = word[pos:]
                if s.startswith(suffix):
                    out.setdefault(tid, set()).add(tuple(encode(s[len(suffix):])[:20]))
    return out


# -- steps 1-2 -------------------------------------------------------------------------------

def reference_dry(x: np.ndarray, seq: list[int], p, breakers: dict[int, set[tuple[int, ...]]]) -> np.ndarray:
    if p.dry_multiplier == 0.0 or p.dry_base < 1.0 or p.dry_penalty_last_n == 0:
        return x
    window = list(seq) if p.dry_penalty_last_n < 0 else list(seq[-p.dry_penalty_last_n:]) if seq else []
    n = len(window)
    allowed = p.dry_allowed_length
    if n <= allowed:
        return x
    limit = n
    for i in range(n):  # i tokens back from the newest
        head = window[n - 1 - i]
        if head not in breakers:
            continue
        longest = -1
        for tail in breakers[head]:
            if len(tail) <= i and all(window[n - i + o] == tail[o] for o in range(len(tail))):
                longest = max(longest, len(tail))
        if longest >= 0:
            limit = i - longest
            break
    if limit < allowed:
        return x
    best: dict[int, int] = {}
    for j in range(n - 1):
        m = 0
        while m <= j and window[j - m] == window[n - 1 - m]:
            m += 1
        m = min(m, limit)
        if m >= allowed:
            tok = window[j + 1]
            best[tok] = max(best.get(tok, 0), m)
    max_exp = int(88.7228391 / math.log(p.dry_base)) if p.dry_base > 1.000001 else 0
    x = x.copy()
    for tok, m in best.items():
        if () in breakers.get(tok, ()):
            continue
        e = m - allowed
        if max_exp > 0:
            e = min(e, max_exp)
        if tok < len(x):
            x[tok] = F32(x[tok] - F32(p.dry_multiplier * p.dry_base**e))
    return x


def reference_adjusted_row(logits: np.ndarray, seq: list[int], p, eos_ids=(), breakers=None) -> np.ndarray:
    x = np.asarray(logits, dtype=F32).copy()
    v = len(x)
    bias = {int(t): float(b) for t, b in p.logit_bias.items() if 0 <= int(t) < v}
    if p.ignore_eos:
        for t in eos_ids:
            bias[int(t)] = -math.inf
    for t, b in bias.items():
        x[t] = F32(x[t] + F32(b))
    if p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0):
        window = seq if p.repeat_last_n < 0 else seq[-p.repeat_last_n:] if seq else []
        for tok, count in Counter(window).items():
            if not 0 <= tok < v:
                continue
            if x[tok] <= 0:
                x[tok] = F32(x[tok] * F32(p.repeat_penalty))
            else:
                x[tok] = F32(x[tok] / F32(p.repeat_penalty))
            x[tok] = F32(x[tok] - (F32(count) * F32(p.frequency_penalty) + F32(1.0) * F32(p.presence_penalty)))
    return reference_dry(x, seq, p, breakers or {})


# -- steps 3-5 -------------------------------------------------------------------------------

def _by_logit(cands):
    return sorted(cands, key=lambda c: (-c[0], c[1]))


def reference_distribution_row(adjusted: np.ndarray, p, coin: float = 1.0) -> np.ndarray:
    """p for one row of adjusted logits. ``coin`` is the row's XTC uniform."""
    v = len(adjusted)
    if p.temperature <= 0 or p.top_k == 1:
        out = np.zeros(v, dtype=F32)
        out[int(np.argmax(adjusted))] = 1.0
        return out
    min_keep = p.min_keep
    cands = [(F32(adjusted[t]), t) for t in range(v)]
    cands = _by_logit(cands)
    # top-k
    if p.top_k > 0:
        cands = cands[: min(p.top_k, len(cands))]
    # typical
    if p.typical_p < 1.0:
        probs = softmax32([c[0] for c in cands])
        ent = F32(0.0)
        for q in probs:
            if q > 0:
                ent = F32(ent - q * F32(np.log(q)))
        with np.errstate(divide="ignore"):
            scores = [F32(abs(-np.log(q) - ent)) if q > 0 else F32(np.inf) for q in probs]
        order = sorted(range(len(cands)), key=lambda i: (scores[i], i))
        cum, last = F32(0.0), len(order)
        for i, idx in enumerate(order):
            cum = F32(cum + probs[idx])
            if cum > F32(p.typical_p) and (min_keep == 0 or i >= min_keep - 1):
                last = i + 1
                break
        cands = [cands[idx] for idx in order[:last]]
    # top-p
    if p.top_p < 1.0:
        cands = _by_logit(cands)
        probs = softmax32([c[0] for c in cands])
        cum, last = F32(0.0), len(cands)
        for i in range(len(cands)):
            cum = F32(cum + probs[i])
            if cum >= F32(p.top_p) and i + 1 >= min_keep:
                last = i + 1
                break
        cands = cands[:last]
    # min-p
    if p.min_p > 0.0:
        threshold = F32(max(c[0] for c in cands) + F32(math.log(p.min_p)))
        kept = [c for c in cands if c[0] >= threshold]
        if kept and len(kept) >= min_keep:
            cands = kept
        else:
            cands = _by_logit(cands)
            i = 1
            while i < len(cands) and not (cands[i][0] < threshold and i >= min_keep):
                i += 1
            cands = cands[:i]
    # XTC
    if p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5 and len(cands) >= 2 and coin <= p.xtc_probability:
        cands = _by_logit(cands)
        probs = softmax32([c[0] for c in cands])
        pos_last = 0
        for i in range(len(cands)):
            if probs[i] >= F32(p.xtc_threshold):
                pos_last = i
            else:
                break
        if len(cands) - pos_last >= min_keep and pos_last > 0:
            cands = cands[pos_last:]
    # temperature
    scaled = np.array([c[0] for c in cands], dtype=F32) / F32(p.temperature)
    probs = softmax32(scaled)
    out = np.zeros(v, dtype=F32)
    for (_, tok), q in zip(cands, probs):
        out[tok] = q
    return out


def reference_block(logits: np.ndarray, history, appended, p, *, eos_ids=(), breakers=None, coins=None):
    """(adjusted [N, V], p [N, V]) for a block; row i sees history + appended[:i]."""
    logits = np.asarray(logits, dtype=F32)
    adjusted, dist = [], []
    for i in range(logits.shape[0]):
        seq = list(history) + list(appended[:i])
        a = reference_adjusted_row(logits[i], seq, p, eos_ids, breakers)
        adjusted.append(a)
        dist.append(reference_distribution_row(a, p, 1.0 if coins is None else float(coins[i])))
    return np.stack(adjusted), np.stack(dist)
