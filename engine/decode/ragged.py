"""One forward over rows that each bring their own number of tokens, on a cache where each row keeps
or drops its own tail: what lets every speculating row's verify block (its pending token and its
own ``k_i`` drafts) run in one target forward per engine iteration.

Why not mlx-lm's ``BatchKVCache``: its rows share one write index (a row shorter than the longest
is left-padded), so a row that rejects ``r`` drafts while another accepts all of its own would have
to move its whole KV history ``r`` places right to stay aligned (measured at 15-55 ms a round on
SmolLM2 here). :class:`RaggedKVCache` instead keeps one length per row. A forward of width ``T``
writes row ``i``'s ``T`` new entries at that row's own length (rows with fewer than ``T`` tokens
are right-padded: the padding is written past the row's end, never attended, and overwritten
later), the mask lets row ``i``'s query ``t`` see keys ``0 .. L_i + t`` exactly, and rotary
positions are the per-row lengths. Dropping a row's rejected tail is then ``L_i -= r``: O(1), no
copy. Rows join with a copy of their single-sequence ``KVCache`` and leave as one again (for the
slot's prompt reuse), so what enters and leaves is the cache ``decode.kv_cache`` rewinds exactly.

``docs/benchmarks.md`` compares this design with the alternative of keeping each row's own cache
and concatenating them into a padded batch for every forward (``scripts/bench_ragged_cache.py``).

Exactness: a row's logits are bitwise the same whatever else is in the forward (and alone) where
the matmul kernels round a row independently of the matrix height, which mlxcel's packed CPU
kernels do from two rows up (hence no forward is one token wide; ``tests/engine/decode/test_ragged.py``)
and masked attention does over padded keys; OpenBLAS's float32 sgemm does not promise it (its rows
move by ~1e-6 with the height), exactly as for the plain ``DecodeBatch``. The decisions on those
logits are the rules' own, so every row's tokens are the ones it gets alone wherever the logits are.

Only plain attention caches (mlx-lm ``KVCache``) join: sliding windows, quantized and recurrent
layers keep the per-row path (see :func:`joinable`). Pure MLX, synchronous.

:class:`StepPlan` is the iteration's work as plain data (row keys and their tokens), so that what
one iteration forwards can be logged, counted and sent elsewhere (another rank) as it is.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

_STEP = 256  # capacity grows in multiples of this many positions, as mlx-lm's KVCache does


@dataclass
class StepPlan:
    """What one engine iteration forwards in the ragged batch: per row (``rows[i]``, a slot id) the
    tokens it feeds (``tokens[i]``: a verify block ``[pending, d_0 .. d_{k-1}]``, or one token) and
    the absolute position of the first of them (``positions[i]``: the row's cache length)."""

    rows: list[Hashable] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    def add(self, row: Hashable, tokens: Sequence[int], position: int) -> None:
        self.rows.append(row)
        self.tokens.append([int(t) for t in tokens])
        self.positions.append(int(position))

    @property
    def width(self) -> int:
        """Tokens per row in the forward (the longest row's)."""
        return max((len(t) for t in self.tokens), default=0)

    @property
    def n_tokens(self) -> int:
        """Real (unpadded) tokens in the forward."""
        return sum(len(t) for t in self.tokens)

    def __len__(self) -> int:
        return len(self.rows)


def joinable(cache: list[Any]) -> bool:
    """Whether a single-sequence cache can join a :class:`RaggedBatch`: every layer a plain ``KVCache``."""
    return bool(cache) and all(type(c) is KVCache for c in cache)


class RaggedKVCache:
    """One attention layer's cache for rows of different lengths (module docstring).

    ``keys`` / ``values``: ``[B, heads, capacity, dim]``; ``lengths[i]``: the tokens row ``i`` holds.
    During a forward, ``offset`` is the per-row lengths before it (the rotary positions) and
    ``make_mask`` the per-row causal mask."""

    def __init__(self):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.lengths: list[int] = []
        self.offset: mx.array = mx.array([], dtype=mx.int32)

    # -- rows in and out ---------------------------------------------------------------------------

    def _reserve(self, need: int, like: mx.array | None = None) -> None:
        cap = 0 if self.keys is None else self.keys.shape[2]
        if need <= cap:
            return
        new_cap = ((need + _STEP - 1) // _STEP) * _STEP
        if self.keys is None:
            b, h, _, d = like.shape
            self.keys = mx.zeros((0, h, new_cap, d), dtype=like.dtype)
            self.values = mx.zeros((0, h, new_cap, d), dtype=like.dtype)
            return
        b, h, _, d = self.keys.shape
        pad = mx.zeros((b, h, new_cap - cap, d), dtype=self.keys.dtype)
        self.keys = mx.concatenate([self.keys, pad], axis=2)
        self.values = mx.concatenate([self.values, pad], axis=2)

    def append_row(self, layer: KVCache) -> None:
        n = int(layer.offset)
        k, v = layer.keys[..., :n, :], layer.values[..., :n, :]
        self._reserve(n, like=k)
        cap = self.keys.shape[2]
        pad = mx.zeros((1, k.shape[1], cap - n, k.shape[3]), dtype=self.keys.dtype)
        self.keys = mx.concatenate([self.keys, mx.concatenate([k, pad], axis=2)], axis=0)
        self.values = mx.concatenate([self.values, mx.concatenate([v, pad], axis=2)], axis=0)
        self.lengths.append(n)

    def extract_row(self, i: int) -> KVCache:
        layer = KVCache()
        n = self.lengths[i]
        if n:
            layer.keys = mx.array(self.keys[i:i + 1, :, :n, :])
            layer.values = mx.array(self.values[i:i + 1, :, :n, :])
            layer.offset = n
        return layer

    def keep_rows(self, keep: list[int]) -> None:
        if not keep:
            self.keys = self.values = None
            self.lengths = []
            return
        index = mx.array(keep, dtype=mx.int32)
        self.keys, self.values = self.keys[index], self.values[index]
        self.lengths = [self.lengths[i] for i in keep]

    # -- the forward (what an mlx-lm attention layer calls) ------------------------------------------

    def begin(self, width: int) -> None:
        """Before a forward of ``width`` tokens per row: room for them, positions for the rotary embedding."""
        self._reserve(max(self.lengths) + width)
        self.offset = mx.array(self.lengths, dtype=mx.int32)
        self._width = width

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        width = keys.shape[2]
        for i, n in enumerate(self.lengths):
            self.keys[i:i + 1, :, n:n + width, :] = keys[i:i + 1]
            self.values[i:i + 1, :, n:n + width, :] = values[i:i + 1]
        end = max(self.lengths) + width
        return self.keys[:, :, :end, :], self.values[:, :, :end, :]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        """Row ``i``'s query ``t`` (absolute position ``L_i + t``) sees keys ``0 .. L_i + t``."""
        end = max(self.lengths) + n
        queries = self.offset[:, None] + mx.arange(n)[None, :]  # [B, n]
        mask = mx.arange(end)[None, None, :] <= queries[:, :, None]  # [B, n, end]
        return mask[:, None]

    def advance(self, counts: Sequence[int]) -> None:
        """After a forward: row ``i`` now holds ``counts[i]`` more tokens (its real ones, not the padding)."""
        self.lengths = [n + int(c) for n, c in zip(self.lengths, counts)]

    @property
    def state(self):
        return self.keys, self.values


class RaggedBatch:
    """The rows of a ragged forward (speculating rows), keyed by slot id, with one
    :class:`RaggedKVCache` per layer."""

    def __init__(self, model):
        self.model = model
        self.rows: list[Hashable] = []
        self.cache: list[RaggedKVCache] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, row: Hashable) -> bool:
        return row in self.rows

    def length(self, row: Hashable) -> int:
        return self.cache[0].lengths[self.rows.index(row)]

    def add(self, row: Hashable, cache: list[Any]) -> None:
        """Append a row whose single-sequence ``cache`` (``joinable``) holds its context."""
        if row in self.rows:
            raise ValueError(f"row {row!r} is already in the batch")
        if not joinable(cache):
            raise ValueError("only plain KVCache layers can join a ragged batch")
        if self.cache is None:
            self.cache = [RaggedKVCache() for _ in cache]
        for layer, single in zip(self.cache, cache):
            layer.append_row(single)
        mx.eval([layer.state for layer in self.cache])
        self.rows.append(row)

    def remove(self, rows: Sequence[Hashable]) -> dict[Hashable, list[KVCache]]:
        """Take rows out; returns each one's single-sequence cache (exactly what the row holds)."""
        rows = [r for r in rows if r in self.rows]
        if not rows:
            return {}
        out = {r: [layer.extract_row(self.rows.index(r)) for layer in self.cache] for r in rows}
        keep = [i for i, r in enumerate(self.rows) if r not in out]
        for layer in self.cache:
            layer.keep_rows(keep)
        if not keep:
            self.cache = None
        self.rows = [self.rows[i] for i in keep]
        return out

    def rewind(self, row: Hashable, n: int) -> None:
        """Drop the last ``n`` tokens of one row (its rejected drafts): exact and O(1)."""
        if n <= 0:
            return
        i = self.rows.index(row)
        if n > self.cache[0].lengths[i]:
            raise ValueError(f"row {row!r} holds {self.cache[0].lengths[i]} tokens, cannot drop {n}")
        for layer in self.cache:
            layer.lengths[i] -= n

    def forward(self, plan: StepPlan) -> list[mx.array]:
        """Run ``plan`` (which must name every row, in ``self.rows`` order) in one forward; returns
        each row's logits ``[len(plan.tokens[i]), V]``, queued (``mx.async_eval``). Each row's cache
        then holds its tokens.

        The forward never carries a single token in all: a one-row matmul takes another kernel than
        a taller one (other rounding), so a lone one-token step is laid out as two (the second a
        padding copy) to round exactly as it does beside other rows."""
        if plan.rows != self.rows:
            raise ValueError("the step plan must name every row of the batch, in order")
        counts = [len(t) for t in plan.tokens]
        tokens = [list(t) for t in plan.tokens]
        if sum(counts) == 1:
            tokens[0] = tokens[0] + tokens[0]
        width = max(len(t) for t in tokens)
        for layer in self.cache:
            layer.begin(width)
        if packable(self.model):
            flat = _packed_forward(self.model, tokens, self.cache, width)
            starts = [0]
            for t in tokens:
                starts.append(starts[-1] + len(t))
            logits = [flat[starts[i]:starts[i] + c] for i, c in enumerate(counts)]
        else:
            x = mx.array([t + [0] * (width - len(t)) for t in tokens], dtype=mx.int32)
            padded = self.model(x, cache=self.cache)
            logits = [padded[i, :c] for i, c in enumerate(counts)]
        for layer in self.cache:
            layer.advance(counts)
        mx.async_eval(logits, [layer.state for layer in self.cache])
        return logits


# mlx-lm families whose decoder layer is exactly ``h + attn(norm(h))`` then ``h + mlp(norm(h))`` with a
# q/k/v/o-projection attention (no q/k norms, no sliding layers): their projections, MLPs and head
# can run on the real tokens alone, laid out flat, with only the attention on the padded per-row view.
_PACKED_TYPES = {"llama", "mistral", "qwen2"}


def packable(model) -> bool:
    """Whether :func:`_packed_forward` reproduces ``model``'s own forward for a ragged batch."""
    inner = getattr(model, "model", None)
    if getattr(model, "model_type", None) not in _PACKED_TYPES or inner is None:
        return False
    layers = getattr(inner, "layers", [])
    return bool(layers) and all(
        not getattr(layer, "use_sliding", False) and hasattr(layer, "self_attn") and hasattr(layer, "mlp")
        and all(hasattr(layer.self_attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads",
                                                       "n_kv_heads", "scale"))
        and not hasattr(layer.self_attn, "q_norm")
        for layer in layers)


def _packed_forward(model, tokens: list[list[int]], cache: list[RaggedKVCache], width: int) -> mx.array:
    """The model's forward over the rows' tokens with no padding in the matmuls: the embedding,
    projections, MLPs, norms and head see the ``N`` real tokens as one flat sequence; only the
    attention sees the ``[B, width]`` per-row layout (gathered from the flat rows, and gathered back).
    On a CPU the forward's cost grows with its tokens, so padding every row to the widest row's
    block (a 33-token verify beside 1-token steps) would cost as much as the real work several
    times over. Written here because mlx-lm's models take one rectangular batch only; the ops are
    the model's own, in its order. Returns the logits ``[N, V]``, rows in plan order."""
    inner = model.model
    b = len(tokens)
    flat_tokens = [t for row in tokens for t in row]
    starts, gather, scatter = 0, [], []
    for i, row in enumerate(tokens):
        gather.extend(starts + min(t, len(row) - 1) for t in range(width))  # padding slots repeat a real row
        scatter.extend(i * width + t for t in range(len(row)))
        starts += len(row)
    gather_idx = mx.array(gather, dtype=mx.int32)
    scatter_idx = mx.array(scatter, dtype=mx.int32)
    h = inner.embed_tokens(mx.array([flat_tokens], dtype=mx.int32))  # [1, N, H]
    mask = cache[0].make_mask(width)
    for layer, c in zip(inner.layers, cache):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

        def per_row(a, heads):
            return mx.take(a[0], gather_idx, axis=0).reshape(b, width, heads, -1).transpose(0, 2, 1, 3)

        q, k, v = per_row(q, attn.n_heads), per_row(k, attn.n_kv_heads), per_row(v, attn.n_kv_heads)
        q = attn.rope(q, offset=c.offset)
        k = attn.rope(k, offset=c.offset)
        k, v = c.update_and_fetch(k, v)
        o = scaled_dot_product_attention(q, k, v, cache=c, scale=attn.scale, mask=mask)
        o = mx.take(o.transpose(0, 2, 1, 3).reshape(b * width, -1), scatter_idx, axis=0)[None]
        h = h + attn.o_proj(o)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    if getattr(model.args, "tie_word_embeddings", False):
        return inner.embed_tokens.as_linear(h)[0]
    return model.lm_head(h)[0]
