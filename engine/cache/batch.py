"""Forward passes for the server's continuous batching: one prefill chunk of a single sequence, and
one batched decode step over every active row. (Cache length and rewind: ``kv_cache``.)

Each sequence owns an ordinary per-layer cache (``LoadedModel.make_cache()``) while its prompt is
prefilled; that cache is what the server keeps per slot for prompt-prefix reuse. When a sequence
starts decoding it joins a :class:`DecodeBatch`, which holds one left-padded batch cache per layer
(mlx-lm's ``BatchKVCache`` / ``BatchRotatingKVCache``, built with the per-layer cache class's
``merge``). All rows then advance in a single ``model(tokens[B, 1])`` call. A finished row is
extracted back into a single-sequence cache and filtered out of the batch.

mlx-lm's own ``BatchGenerator`` couples scheduling, sampling and caching into one object; the server
needs per-row sampler chains, stop strings and prompt caches, so only the cache plumbing is shared
with it (the cache classes themselves), and this module stays a thin, synchronous layer over them.
Pure MLX: no threads, no asyncio.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import mlx.core as mx

# Architectures whose forward is exactly ``head(model.model(x))`` (mlx-lm's llama/qwen/mistral
# family): for them a prefill chunk projects only its last position onto the vocabulary.
_PLAIN_HEAD_TYPES = {"llama", "qwen2", "qwen3", "mistral", "smollm3"}


def plain_head(model) -> bool:
    """Whether ``model``'s forward is exactly ``head(model.model(x))`` (see ``_PLAIN_HEAD_TYPES``)."""
    return getattr(model, "model_type", None) in _PLAIN_HEAD_TYPES and hasattr(model, "model")


def last_row_head(model, hidden: mx.array) -> mx.array:
    """A plain-head model's logits ``[V]`` for the last row of its final hidden states ``[1, T, H]``."""
    hidden = hidden[:, -1:, :]
    if getattr(model.args, "tie_word_embeddings", False):
        return model.model.embed_tokens.as_linear(hidden)[0, -1]
    return model.lm_head(hidden)[0, -1]


def last_position_logits(model, x: mx.array, cache: list[Any]) -> mx.array:
    """Logits of the last position only. mlx-lm's models project every position of a chunk onto
    the vocabulary; on a 49k-token vocabulary that is a large share of a prompt's compute, so for
    plain-head architectures the head is applied to the last hidden state alone."""
    if plain_head(model):
        return last_row_head(model, model.model(x, cache))
    return model(x, cache=cache)[0, -1]


def forward_chunk(model, tokens: Sequence[int], cache: list[Any]) -> mx.array:
    """Feed ``tokens`` to one sequence's ``cache`` and return the logits of the last position,
    shape ``[V]``, evaluated (the cache state is evaluated with them)."""
    logits = last_position_logits(model, mx.array(list(tokens), dtype=mx.int32)[None], cache)
    mx.eval(logits, [c.state for c in cache])
    return logits


def mergeable(cache: list[Any]) -> bool:
    """Whether a single-sequence cache can join a :class:`DecodeBatch`: every layer's class has mlx-lm's
    batch ``merge`` (a quantized KV cache has none)."""
    return bool(cache) and all(hasattr(type(c), "merge") for c in cache)


class DecodeBatch:
    """The rows currently decoding, with one batch cache per layer.

    Rows are identified by any hashable key (the server uses slot ids)."""

    def __init__(self, model):
        self.model = model
        self.rows: list[Hashable] = []
        self.cache: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, row: Hashable) -> bool:
        return row in self.rows

    def add(self, row: Hashable, cache: list[Any]) -> None:
        """Append a row whose single-sequence ``cache`` already holds its context."""
        if row in self.rows:
            raise ValueError(f"row {row!r} is already in the batch")
        merged = [type(c).merge([c]) for c in cache]
        if self.cache is None:
            self.cache = merged
        else:
            for batch_layer, row_layer in zip(self.cache, merged):
                batch_layer.extend(row_layer)
        self.rows.append(row)

    def remove(self, rows: Sequence[Hashable]) -> dict[Hashable, list[Any]]:
        """Take rows out of the batch; returns each one's single-sequence cache."""
        rows = [r for r in rows if r in self.rows]
        if not rows:
            return {}
        out = {}
        for r in rows:
            i = self.rows.index(r)
            out[r] = [layer.extract(i) for layer in self.cache]
        keep = [i for i, r in enumerate(self.rows) if r not in out]
        if keep:
            index = mx.array(keep, dtype=mx.int32)
            for layer in self.cache:
                layer.filter(index)
        else:
            self.cache = None
        self.rows = [self.rows[i] for i in keep]
        return out

    def step(self, tokens: Sequence[int]) -> mx.array:
        """Feed one token per row (in ``self.rows`` order); the next-token logits ``[B, V]``."""
        logits = self.queue_step(tokens)
        mx.eval(logits)
        return logits

    def queue_step(self, tokens: Sequence[int] | mx.array) -> mx.array:
        """``step`` without waiting: the forward is queued (``mx.async_eval``) and its logits
        ``[B, V]`` returned lazy. ``tokens`` may itself be a lazy ``[B]`` array, e.g. the rows'
        picks from the previous step's logits (``SamplerChain.pick``) not yet read back.

        This is what lets a scheduler pipeline as ``decode.generate_tokens`` does: pick step n's
        tokens lazily, queue step n + 1 on them, *then* read step n's tokens back and stream them,
        so building step n + 1's graph (~4 ms of Python for SmolLM2 on a CPU) overlaps the
        evaluation of step n instead of adding to it. The price is the cache contract of
        ``generate_tokens``: a row that turns out finished has already been forwarded over its last
        token (its cache holds one entry past its final position, which a caller keeping the cache
        for prompt reuse must rewind or account for)."""
        if isinstance(tokens, mx.array):
            if tokens.shape != (len(self.rows),):
                raise ValueError(f"tokens of shape {tokens.shape} for {len(self.rows)} rows")
            x = tokens.astype(mx.int32)[:, None]
        else:
            if len(tokens) != len(self.rows):
                raise ValueError(f"{len(tokens)} tokens for {len(self.rows)} rows")
            x = mx.array(list(tokens), dtype=mx.int32)[:, None]
        logits = self.model(x, cache=self.cache)[:, -1, :]
        mx.async_eval(logits)
        return logits
