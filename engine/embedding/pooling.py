"""A sequence's embedding from the model's final hidden states, pooled and normalised as llama.cpp
does it.

For a decoder the hidden states are what the LM head reads: the output of the final norm, one row
per token (llama.cpp's ``result_norm``), recorded by ``speculative.target_features`` from the
model's own forward; the sequence runs through a fresh cache in chunks, so an input as long as the
context fits. For a BERT-family encoder (``engine.model.encoder``) they are its last layer's
output (``result_embd``), the whole input in one bidirectional forward. Poolings: ``none`` (every
row), ``mean``, ``cls`` (the first row), ``last``, and ``rank``: the summary row through the
model's rank head (``rank_head``; without one, the row itself, as llama.cpp), the summary row being
the last for a causal model and the first (``[CLS]``) for an encoder, as llama.cpp picks it.
Normalisations (``--embd-normalize`` / ``embd_normalize``): -1 none, 0 max-absolute scaled to the
int16 range, 1 taxicab, 2 euclidean, p > 2 the p-norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxcel.engine.embedding.rank_head import RankHead
from mlxcel.engine.model.encoder.network import Encoder
from mlxcel.engine.speculative.target_features import forward_with_features

POOLINGS = ("none", "mean", "cls", "last", "rank")
# llama.cpp's enum llama_pooling_type, as GGUF metadata ({arch}.pooling_type) stores it
GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def hidden_states(model: Any, tokens: Sequence[int], step: int = 512) -> mx.array:
    """``[T, H]``: the final-norm output for every token, in chunks of ``step`` over a fresh cache
    (an encoder's last-layer output, in one forward: it has no cache to carry chunks over)."""
    if isinstance(model, Encoder):
        return model.hidden_states(tokens)
    cache = make_prompt_cache(model)
    rows = []
    for start in range(0, len(tokens), max(1, step)):
        normed = forward_with_features(model, tokens[start:start + step], cache, (), logits=False).normed
        mx.eval(normed, [c.state for c in cache])
        rows.append(normed)
    return mx.concatenate(rows, axis=0) if len(rows) > 1 else rows[0]


def summary_row(model: Any) -> int:
    """The row rank pooling reads: the last for a causal model, the first for a bidirectional one."""
    return 0 if isinstance(model, Encoder) else -1


def pooled(hidden: mx.array, pooling: str, head: RankHead | None = None, row: int = -1) -> np.ndarray:
    """``[H]`` (``[T, H]`` for ``none``; the head's outputs for ``rank``, read from ``row``) as float32."""
    if pooling == "none":
        out = hidden
    elif pooling == "mean":
        out = mx.mean(hidden.astype(mx.float32), axis=0)
    elif pooling == "cls":
        out = hidden[0]
    elif pooling == "last":
        out = hidden[-1]
    elif pooling == "rank":
        # no head: the summary row itself, as llama.cpp's rank pooling leaves it (its score is row[0])
        out = hidden[row] if head is None else head.outputs(hidden, row)
    else:
        raise ValueError(f"unknown pooling {pooling!r} (one of {', '.join(POOLINGS)})")
    return np.array(out.astype(mx.float32))


def normalize(vector: np.ndarray, norm: int) -> np.ndarray:
    """``vector`` scaled by upstream's ``embd_normalize`` rule (a zero vector stays zero)."""
    v = vector.astype(np.float64)
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = float(np.max(np.abs(v), initial=0.0)) / 32760.0
    elif norm == 2:
        total = float(np.sqrt(np.sum(v * v)))
    else:
        total = float(np.sum(np.abs(v) ** norm) ** (1.0 / norm))
    scale = 1.0 / total if total > 0 else 0.0
    return (v * scale).astype(np.float32)


def embed(model: Any, tokens: Sequence[int], pooling: str, *, normalization: int = 2, head: RankHead | None = None,
          step: int = 512) -> np.ndarray:
    """One input's embedding: ``[H]`` pooled and normalised, or ``[T, H]`` rows as they are for
    ``none`` (upstream normalises only pooled embeddings)."""
    if not tokens:
        raise ValueError("an embedding needs at least one token")
    out = pooled(hidden_states(model, list(tokens), step), pooling, head, summary_row(model))
    return out if pooling == "none" else normalize(out, normalization)
