"""One forward over rows that each bring their own number of tokens, on a cache where each row keeps
or drops its own tail: what lets every row of an engine iteration (a speculating row's verify
block, its pending token and its own ``k_i`` drafts; a plain row's one token; a prompt's chunk) run
in one target forward.

Why not mlx-lm's ``BatchKVCache``: its rows share one write index (a row shorter than the longest
is left-padded), so a row that rejects ``r`` drafts while another accepts all of its own would have
to move its whole KV history ``r`` places right to stay aligned (measured at 15-55 ms a round on
SmolLM2 here). :class:`RaggedKVCache` instead keeps one length per row. A forward writes row
``i``'s new entries at that row's own positions (one scatter per layer into a token-major cache),
row ``i``'s query ``t`` sees keys ``0 .. L_i + t`` exactly, and rotary positions are per token.
Dropping a row's rejected tail is then ``L_i -= r``: O(1), no copy. Rows join with a copy of their
single-sequence ``KVCache`` (possibly empty: a prompt prefilled in the batch) and leave as one again
(for the slot's prompt reuse), so what enters and leaves is the cache ``cache.kv_cache`` rewinds
exactly. A row brings any number of tokens (a decode step, a verify block, a prompt chunk) and asks
for the logits of as many of its last positions as it needs (``StepPlan.logits``).

``docs/benchmarks.md`` compares this design with the alternative of keeping each row's own cache
and concatenating them into a padded batch for every forward (``scripts/bench_ragged_cache.py``).

Exactness: on a model running mlxcel's fused CPU ops (packed weights on the CPU) every token runs
flat, with no padding: the matmul kernels round a row independently of the matrix height, one row
included (``tests/engine/platform/test_qmatmul.py``), the per-token rope and the ragged attention
(``platform.ragged_ops``) compute each token and query by the single-sequence fused ops' own code,
over exactly its row's keys. So a row's logits are bitwise the same whatever else is in the forward,
and the same as the single-sequence forward of the same chunks gives (``tests/engine/cache/test_ragged.py``).
Elsewhere (Metal, CUDA, float weights, ``MLXCEL_FUSED_OPS=0``) the attention is MLX's masked one on a
padded ``[B, width]`` view: exact only where its kernels round a row independently of the padded
shape, which MLX's CPU masked attention (BLAS sgemm and softmax over the padded keys) does not
promise, exactly as for the plain ``DecodeBatch``. The decisions on those logits are the rules' own,
so every row's tokens are the ones it gets alone wherever the logits are.

Only plain attention caches (mlx-lm ``KVCache``) join: sliding windows, quantized and recurrent
layers keep the per-row path (see :func:`joinable`). Pure MLX, synchronous.

:class:`StepPlan` is the iteration's work as plain data (row keys and their tokens), so that what
one iteration forwards can be logged, counted and sent elsewhere (another rank) as it is.

LoRA: each row brings its adapter scales (``StepPlan.adapters``); the forward lays them out per flat
token (``model.lora_linear.flat_scales``) and the head sees those of the positions it projects, so
rows with different adapter mixes share the forward, each row's delta computed with its own scales by
kernels that round a row the same at any height (``lora_linear``'s exactness note).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

from mlxcel.engine.model.lora_linear import active_scales, flat_scales, row_scales, scales_at
from mlxcel.engine.platform.lean_blocks import BlockPlan, output_and_mlp, qkv_products
from mlxcel.engine.platform.ragged_ops import ragged_attention, rope_positions, runs_fused
from mlxcel.engine.platform.settings import settings

_STEP = 256  # capacity grows in multiples of this many positions, as mlx-lm's KVCache does
# An emptied batch keeps its keys and values (every layer's, together) up to this size, so that the
# next rows to join write into places that exist (RaggedBatch.remove).
RETAIN_EMPTY_BYTES = 128 << 20


@dataclass
class StepPlan:
    """What one engine iteration forwards in the ragged batch: per row (``rows[i]``, a slot id) the
    tokens it feeds (``tokens[i]``: a verify block ``[pending, d_0 .. d_{k-1}]``, one token, or a
    prefill chunk), the absolute position of the first of them (``positions[i]``: the row's cache
    length) and how many of its last positions need logits (``logits[i]``: all of a verify block,
    one for a decode step or a prompt's last chunk, none for a chunk inside a prompt), and its LoRA
    scales (``adapters[i]``, one per adapter; empty: the base model)."""

    rows: list[Hashable] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    logits: list[int] = field(default_factory=list)
    adapters: list[tuple[float, ...]] = field(default_factory=list)

    def add(self, row: Hashable, tokens: Sequence[int], position: int, logits: int | None = None,
            adapters: Sequence[float] = ()) -> None:
        """``logits``: how many of the row's last positions get logits (None: every one)."""
        self.rows.append(row)
        self.tokens.append([int(t) for t in tokens])
        self.positions.append(int(position))
        n = len(self.tokens[-1])
        self.logits.append(n if logits is None else max(0, min(int(logits), n)))
        self.adapters.append(tuple(float(s) for s in adapters))

    @property
    def width(self) -> int:
        """Tokens of the longest row."""
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

    ``keys`` / ``values``: ``[P, capacity, heads, dim]``, token-major so that a forward's new
    entries (each at its row's own position) are written by one scatter. Rows live in physical
    places: row ``i`` (in batch order) is place ``places[i]`` and holds ``lengths[i]`` tokens; a row
    that leaves frees its place for the next one to join, so neither joining nor leaving moves the
    other rows' entries (places grow by doubling). ``keys`` is None until a row brings or writes an
    entry (a row may join empty: a prompt prefilled in the batch). During a forward, ``offset`` is
    the per-row lengths before it (the rotary positions of the padded layout) and ``make_mask`` the
    per-row causal mask."""

    def __init__(self, places: int = 1):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.lengths: list[int] = []
        self.places: list[int] = []
        self.free: list[int] = list(range(max(1, places)))
        self._initial = max(1, places)
        self.offset: mx.array = mx.array([], dtype=mx.int32)
        self._counts: list[int] = []

    # -- rows in and out ---------------------------------------------------------------------------

    def _capacity(self, need: int) -> int:
        return ((max(need, 1) + _STEP - 1) // _STEP) * _STEP

    def _allocate(self, heads: int, dim: int, dtype, need: int) -> None:
        places = max(1, len(self.places) + len(self.free))
        shape = (places, self._capacity(need), heads, dim)
        self.keys, self.values = mx.zeros(shape, dtype=dtype), mx.zeros(shape, dtype=dtype)

    def _reserve(self, need: int) -> None:
        cap = self.keys.shape[1]
        if need <= cap:
            return
        p, _, h, d = self.keys.shape
        pad = mx.zeros((p, self._capacity(need) - cap, h, d), dtype=self.keys.dtype)
        self.keys = mx.concatenate([self.keys, pad], axis=1)
        self.values = mx.concatenate([self.values, pad], axis=1)

    def _place(self) -> int:
        """A free place for a joining row (more places, doubled, when none is free)."""
        if not self.free:
            total = len(self.places)
            grow = max(1, total)
            self.free = list(range(total, total + grow))
            if self.keys is not None:
                _, cap, h, d = self.keys.shape
                pad = mx.zeros((grow, cap, h, d), dtype=self.keys.dtype)
                self.keys = mx.concatenate([self.keys, pad], axis=0)
                self.values = mx.concatenate([self.values, pad], axis=0)
        return self.free.pop(0)

    def append_row(self, layer: KVCache) -> None:
        n = int(layer.offset) if layer.keys is not None else 0
        place = self._place()
        self.places.append(place)
        self.lengths.append(n)
        if n == 0:
            return
        k = layer.keys[..., :n, :].transpose(0, 2, 1, 3)  # [1, n, heads, dim]
        v = layer.values[..., :n, :].transpose(0, 2, 1, 3)
        if self.keys is None:
            self._allocate(k.shape[2], k.shape[3], k.dtype, n)
        self._reserve(n)
        self.keys[place:place + 1, :n] = k
        self.values[place:place + 1, :n] = v

    def extract_row(self, i: int) -> KVCache:
        layer = KVCache()
        n, place = self.lengths[i], self.places[i]
        if n:
            layer.keys = mx.contiguous(self.keys[place:place + 1, :n].transpose(0, 2, 1, 3))
            layer.values = mx.contiguous(self.values[place:place + 1, :n].transpose(0, 2, 1, 3))
            layer.offset = n
        return layer

    def keep_rows(self, keep: list[int], retain: bool = False) -> None:
        """Keep rows ``keep`` (batch indices). With none kept the keys and values are dropped, unless
        ``retain``: then every place they have is free for the next rows (their old entries are past
        any new row's length, never attended)."""
        kept = set(keep)
        self.free.extend(p for i, p in enumerate(self.places) if i not in kept)
        self.free.sort()
        self.lengths = [self.lengths[i] for i in keep]
        self.places = [self.places[i] for i in keep]
        if not keep:
            if retain and self.keys is not None:
                self.free = list(range(self.keys.shape[0]))
            else:
                self.keys = self.values = None
                self.free = list(range(self._initial))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state)

    # -- the forward -----------------------------------------------------------------------------------

    def begin(self, counts: Sequence[int]) -> None:
        """Before a forward in which row ``i`` feeds ``counts[i]`` tokens (padding included)."""
        self._counts = [int(c) for c in counts]
        if self.keys is not None:
            self._reserve(self._need())
        self.offset = mx.array(self.lengths, dtype=mx.int32)

    def _need(self) -> int:
        # room for the padded layout too (every row written ``max(counts)`` places on from its length)
        return max(self.lengths) + max(self._counts)

    def write(self, places: mx.array, positions: mx.array, keys: mx.array, values: mx.array) -> None:
        """Store entry ``j`` (``keys[j]``: ``[heads, dim]``) at place ``places[j]``, position ``positions[j]``."""
        if self.keys is None:
            self._allocate(keys.shape[1], keys.shape[2], keys.dtype, self._need())
        self.keys[places, positions] = keys
        self.values[places, positions] = values

    def head_major(self) -> tuple[mx.array, mx.array]:
        """Every place's keys and values as ``[P, heads, capacity, dim]`` views (no copy)."""
        return self.keys.transpose(0, 2, 1, 3), self.values.transpose(0, 2, 1, 3)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """What an mlx-lm attention layer calls on the padded layout: ``keys`` ``[B, heads, width, dim]``,
        row ``i``'s entries written from its own length on (its padding past its end, never attended);
        returns the rows' keys and values ``[B, heads, end, dim]``, in batch order."""
        b, h, width, d = keys.shape
        places = mx.array(self.places, dtype=mx.int32)
        positions = (self.offset[:, None] + mx.arange(width, dtype=mx.int32)[None, :]).reshape(-1)
        self.write(mx.repeat(places, width), positions, keys.transpose(0, 2, 1, 3).reshape(b * width, h, d),
                   values.transpose(0, 2, 1, 3).reshape(b * width, h, d))
        end = max(self.lengths) + width
        return (self.keys[places, :end].transpose(0, 2, 1, 3), self.values[places, :end].transpose(0, 2, 1, 3))

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
        return [a for a in (self.keys, self.values) if a is not None]


class RaggedBatch:
    """The rows of a ragged forward, keyed by slot id, with one :class:`RaggedKVCache` per layer."""

    def __init__(self, model, places: int = 1):
        """``places``: rows to make room for at once; more are added as rows join, doubling (a
        server leaves it at one: every place costs the longest row's length of memory)."""
        self.model = model
        self.places = places
        self.rows: list[Hashable] = []
        self.cache: list[RaggedKVCache] | None = None
        self._kind: tuple[bool, bool] | None = None  # (packable, runs_fused), read at the first forward
        self.adapters: dict[Hashable, tuple[float, ...]] = {}  # each row's LoRA scales at its last forward

    def _model_kind(self) -> tuple[bool, bool]:
        if self._kind is None:
            self._kind = (packable(self.model), runs_fused(self.model))
        return self._kind

    @property
    def fused(self) -> bool:
        """Whether the forward runs flat on the fused CPU ops (every row's bits independent of the
        batch, one-row forwards included): what :meth:`step` needs."""
        return all(self._model_kind())

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, row: Hashable) -> bool:
        return row in self.rows

    def length(self, row: Hashable) -> int:
        return self.cache[0].lengths[self.rows.index(row)]

    def add(self, row: Hashable, cache: list[Any]) -> None:
        """Append a row whose single-sequence ``cache`` (``joinable``) holds its context (maybe none yet)."""
        if row in self.rows:
            raise ValueError(f"row {row!r} is already in the batch")
        if not joinable(cache):
            raise ValueError("only plain KVCache layers can join a ragged batch")
        if self.cache is None:
            self.cache = [RaggedKVCache(self.places) for _ in cache]
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
        mx.eval([[layer.state for layer in c] for c in out.values()])
        keep = [i for i, r in enumerate(self.rows) if r not in out]
        for r in out:
            self.adapters.pop(r, None)
        # The last rows leaving keep the layers' keys and values when they are small: when a burst of
        # requests arrives, its rows join one by one, and places doubled at the second, third and fifth
        # (each doubling a copy into freshly faulted memory, every layer): 8 SmolLM2 rows of 60 cached
        # tokens took 97 ms to join, 46 of them at the fifth, against 1.7 ms a row into existing places.
        retain = not keep and sum(layer.nbytes for layer in self.cache) <= RETAIN_EMPTY_BYTES
        for layer in self.cache:
            layer.keep_rows(keep, retain)
        if not keep and not retain:
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

    def forward(self, plan: StepPlan) -> list[mx.array | None]:
        """Run ``plan`` (which must name every row, in ``self.rows`` order) in one forward; returns
        each row's logits ``[plan.logits[i], V]`` for its last ``plan.logits[i]`` positions (None
        where it asked for none), queued (``mx.async_eval``). Each row's cache then holds its tokens
        (a row may bring none: it waits, its cache unchanged).

        Off the fused ops the forward never carries a single token, nor a head over a single
        position: there a one-row matmul takes another kernel than a taller one (BLAS sgemv against
        sgemm: other rounding), so a lone one-token step is laid out as two (the second a padding
        copy, written past the row's end) and a lone logits row is projected twice, to round exactly
        as they do beside other rows. The fused ops give a row the same bits at any height, so there
        a lone row runs alone (half the work of a one-row step)."""
        if plan.rows != self.rows:
            raise ValueError("the step plan must name every row of the batch, in order")
        counts = [len(t) for t in plan.tokens]
        # a row with nothing this iteration (a prompt past the chunk budget) feeds one padding token,
        # written past its end and never counted; a lone token is fed twice (see above), except on the
        # fused CPU ops, whose every op gives a row the same bits at any height, one row included
        flat_packed, fused = self._model_kind()
        tokens = [list(t) if t else [0] for t in plan.tokens]
        if sum(len(t) for t in tokens) == 1 and not fused:
            tokens[0] = tokens[0] + tokens[0]
        for layer in self.cache:
            layer.begin([len(t) for t in tokens])
        starts = [0]
        for t in tokens:
            starts.append(starts[-1] + len(t))
        wanted = [list(range(starts[i] + c - n, starts[i] + c)) for i, (c, n) in enumerate(zip(counts, plan.logits))]
        adapters = self._row_adapters(plan)
        if flat_packed:
            picks = [j for w in wanted for j in w]
            with active_scales(flat_scales(adapters, [len(t) for t in tokens])):
                flat = _packed_forward(self.model, tokens, self.cache, picks, fused=fused)  # caches written even with no head
            logits, at = [], 0
            for w in wanted:
                logits.append(flat[at:at + len(w)] if w else None)
                at += len(w)
        else:
            width = max(len(t) for t in tokens)
            x = mx.array([t + [0] * (width - len(t)) for t in tokens], dtype=mx.int32)
            with active_scales(row_scales(adapters)):
                padded = self.model(x, cache=self.cache)
            logits = [padded[i, c - n:c] if n else None for i, (c, n) in enumerate(zip(counts, plan.logits))]
        for layer in self.cache:
            layer.advance(counts)
        mx.async_eval([x for x in logits if x is not None], [layer.state for layer in self.cache])
        return logits

    def _row_adapters(self, plan: StepPlan) -> list[tuple[float, ...]]:
        """Each row's LoRA scales for this forward (a waiting row's padding token runs at its last
        ones, harmlessly: it is written past the row's end); remembered for :meth:`step`."""
        adapters = plan.adapters if len(plan.adapters) == len(plan.rows) else [()] * len(plan.rows)
        for row, tokens, scales in zip(plan.rows, plan.tokens, adapters):
            if tokens:
                self.adapters[row] = scales
        return [self.adapters.get(row, ()) for row in plan.rows]

    def step(self, ids: mx.array) -> mx.array:
        """One decode step of every row (in ``self.rows`` order) over ``ids`` (int32 ``[len(rows)]``,
        possibly lazy: the rows' picks from the previous step, not yet read back); the next-token
        logits ``[len(rows), V]``, queued. Only where :attr:`fused`: there it is exactly
        :meth:`forward` of a plan giving each row its one token and asking for its logits, built
        before the tokens are known (what lets a caller queue step n + 1 before reading step n's
        tokens, as ``decode.plain.generate_tokens`` does). Each row runs at the LoRA scales of its
        last forward (the rows of a pipelined step are those of the forward before it)."""
        if not self.fused:
            raise ValueError("a step over lazy tokens needs the fused CPU ops (RaggedBatch.fused)")
        b = len(self.rows)
        if ids.shape != (b,):
            raise ValueError(f"ids of shape {ids.shape} for {b} rows")
        for layer in self.cache:
            layer.begin([1] * b)
        with active_scales(flat_scales([self.adapters.get(row, ()) for row in self.rows], [1] * b)):
            logits = _packed_forward(self.model, [[0]] * b, self.cache, list(range(b)), ids=ids, fused=True)
        for layer in self.cache:
            layer.advance([1] * b)
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


def _packed_forward(model, tokens: list[list[int]], cache: list[RaggedKVCache], picks: list[int],
                    ids: mx.array | None = None, fused: bool | None = None) -> mx.array | None:
    """The model's forward over the rows' tokens with no padding in the matmuls: the embedding,
    projections, MLPs, norms and head see the ``N`` real tokens as one flat sequence, and the head
    only the positions in ``picks`` (flat indices; a lone one is projected twice, see ``forward``).
    On a CPU the forward's cost grows with its tokens, so padding every row to the widest row's
    block (a 33-token verify or a prompt chunk beside 1-token steps) would cost as much as the real
    work several times over. The attention: on a model running the fused CPU ops, the extension's
    ragged attention over the flat queries (each sees exactly its own row's keys, by the same code
    as the single-sequence fused attention, so a row's bits do not depend on the batch); otherwise
    MLX's masked attention on a padded ``[B, width]`` view gathered from the flat rows (exact only
    where its kernels round a row independently of the padded shape). Written here because mlx-lm's
    models take one rectangular batch only; the ops are the model's own, in its order. Returns the
    logits ``[len(picks), V]`` (None without picks: the caches' writes are what the forward is for).
    ``ids``: the flat token ids as an array (lazy), instead of ``tokens``' values (only their counts read).

    On the fused ops a block that ``platform.lean_blocks`` swapped runs from its plan (the same
    primitives on the same inputs in the same order as its modules give, with ~1/3 of the Python),
    and a lone logits row is projected alone (the fused ops' bits do not depend on the height)."""
    inner = model.model
    b = len(tokens)
    width = max(len(t) for t in tokens)
    flat_tokens = [t for row in tokens for t in row]
    n = len(flat_tokens)
    fused = runs_fused(model) if fused is None else fused
    if fused:
        lengths = cache[0].lengths
        places = cache[0].places  # every layer keeps its rows in the same places
        rows_idx = mx.array([places[i] for i, row in enumerate(tokens) for _ in row], dtype=mx.int32)
        pos_idx = mx.array([lengths[i] + t for i, row in enumerate(tokens) for t in range(len(row))], dtype=mx.int32)
    else:
        starts, gather, scatter = 0, [], []
        for i, row in enumerate(tokens):
            gather.extend(starts + min(t, len(row) - 1) for t in range(width))  # padding slots repeat a real row
            scatter.extend(i * width + t for t in range(len(row)))
            starts += len(row)
        gather_idx = mx.array(gather, dtype=mx.int32)
        scatter_idx = mx.array(scatter, dtype=mx.int32)
        mask = cache[0].make_mask(width)
    h = inner.embed_tokens(mx.array([flat_tokens], dtype=mx.int32) if ids is None
                           else ids.astype(mx.int32).reshape(1, n))  # [1, N, H]
    for layer, c in zip(inner.layers, cache):
        plan = getattr(layer, "_plan", None) if fused else None
        if plan is not None:
            h = _lean_layer(plan, h, c, n, rows_idx, pos_idx)
            continue
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        if fused:
            q = rope_positions(q.reshape(n, attn.n_heads, -1), pos_idx, attn.rope)
            k = rope_positions(k.reshape(n, attn.n_kv_heads, -1), pos_idx, attn.rope)
            c.write(rows_idx, pos_idx, k, v.reshape(n, attn.n_kv_heads, -1))
            keys, values = c.head_major()
            o = ragged_attention(q, keys, values, rows_idx, pos_idx, attn.scale).reshape(1, n, -1)
        else:
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
    if not picks:
        return None
    lone = len(picks) == 1 and not fused
    picked = mx.array(picks + picks if lone else picks, dtype=mx.int32)
    h = mx.take(h[0], picked, axis=0)[None]
    h = inner.norm(h)
    if getattr(model.args, "tie_word_embeddings", False):
        out = inner.embed_tokens.as_linear(h)[0]
    else:
        with scales_at(picked):  # an adapted head: the LoRA scales of the positions it projects
            out = model.lm_head(h)[0]
    return out[:1] if lone else out


def _lean_layer(plan: BlockPlan, h: mx.array, c: RaggedKVCache, n: int, rows_idx: mx.array, pos_idx: mx.array) -> mx.array:
    """One swapped block (``lean_blocks.LeanBlock._plan``) of :func:`_packed_forward` on the fused ops:
    op for op what its modules run there (norm, the q/k/v product, per-token rope, the cache write,
    the ragged attention, o, residual, norm, gate/up, SwiGLU, down, residual), without the module calls.
    As the extension's two layer primitives (:func:`_fused_layer`) unless ``MLXCEL_FUSED_LAYER=0`` asks
    for the separate ones (the comparison the tests and benchmarks make)."""
    ext = plan.ext
    if settings().fused_layer and hasattr(ext, "cache_write"):
        return _fused_layer(plan, h, c, rows_idx, pos_idx)
    q, k, v = qkv_products(plan, h)
    q = ext.rope_positions(q.reshape(n, plan.n_heads, -1), pos_idx, *plan.rope)
    k = ext.rope_positions(k.reshape(n, plan.n_kv_heads, -1), pos_idx, *plan.rope)
    c.write(rows_idx, pos_idx, k, v.reshape(n, plan.n_kv_heads, -1))
    keys, values = c.head_major()
    a = ext.ragged_attention(q, keys, values, rows_idx, pos_idx, plan.scale)
    return output_and_mlp(plan, h, a.reshape(1, n, -1))


def _fused_layer(plan: BlockPlan, h: mx.array, c: RaggedKVCache, rows_idx: mx.array, pos_idx: mx.array) -> mx.array:
    """:func:`_lean_layer` as the extension's two layer primitives around the cache write
    and its cache write (``qmatmul_src/layer.h``): four primitives a layer instead of about twenty,
    the same row code in the same order, so the same bits."""
    ext = plan.ext
    q, k, v = ext.layer_in(h, plan.norm1, plan.eps1, *plan.qkv[:4], list(plan.qkv_bias or ()), pos_idx,
                           plan.n_heads, plan.n_kv_heads, *plan.rope)
    if c.keys is None:
        c._allocate(plan.n_kv_heads, k.shape[2], k.dtype, c._need())
    c.keys, c.values = ext.cache_write(c.keys, c.values, rows_idx, pos_idx, k, v)
    o, down, gate_up = plan.o, plan.down, plan.gate_up
    return ext.layer_out(h, q, c.keys, c.values, rows_idx, pos_idx, plan.scale, o[0], o[1], o[2],
                         [] if plan.o_bias is None else [plan.o_bias], plan.norm2, plan.eps2, gate_up[0], gate_up[1],
                         gate_up[2], gate_up[3][0], down[0], down[1], down[2],
                         [] if plan.down_bias is None else [plan.down_bias])
