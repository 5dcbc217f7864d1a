"""The sampler chain: logits -> the target's effective next-token distribution p.

One function path, in this order (llama-server's default sampler order):

1. token bias (``logit_bias``; ``ignore_eos`` bans every EOS id),
2. penalties over the row's history: repeat / presence / frequency (``penalties.py``), then DRY
   (``dry.py``), then a grammar's mask when the request is constrained (``allowed``: every token the
   grammar forbids at that row's position gets -inf; ``grammar_matcher`` computes the rows),
3. truncation on the *untempered* distribution: top-k, typical-p, top-p, min-p
   (``sampler_filters.py``),
4. XTC on the renormalised filtered row (``xtc.py``),
5. temperature last: ``softmax(logits / T)`` over the surviving tokens.

Steps 1-2 give ``adjusted_logits``. The mask sits after the bias and before the filters, so top-k
keeps the k most likely *allowed* tokens and p is the filtered, tempered distribution over what the
grammar allows: every acceptance rule then keeps its guarantee for the constrained p. Greedy
decoding (temperature <= 0 or top_k == 1) is the argmax of the adjusted logits and never builds a
distribution or draws a key. Row ``i`` of a block is the sequence
``history + appended[:i]``, which is how a verify round evaluates drafted positions, and every
random choice for row ``i`` is keyed by its absolute position ``first_position + i`` (the draw
with stream 0, the XTC coin with stream 3), so a position gets the same p and the same token
whether it is decoded alone or inside a block.

Steps 3-5 are one function over rows (``distribution_rows``): what the chain runs is its
``StageShape``, its values are ``[N, 1]`` columns (``StageValues``), so rows of many chains of one
shape go through one graph (``batch_select``) with the ops each runs alone.

Disabled stages cost nothing; the defaults run bias-free top-k 40 -> top-p -> min-p ->
temperature on ``[N, 40]`` candidates, one scatter back to ``[N, V]``, and no host sync.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel.engine.platform.argmax import argmax_last
from mlxcel.engine.sampling.dry import DryBreakers, apply_dry, breakers_from_strings, dry_enabled
from mlxcel.engine.sampling.filters import (
    NEG_INF,
    Candidates,
    min_p_filter,
    top_candidates,
    top_p_filter,
    typical_filter,
)
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.sampling.penalties import apply_penalties, penalties_enabled
from mlxcel.engine.sampling.random_keys import position_key
from mlxcel.engine.sampling.xtc import xtc_coins, xtc_enabled, xtc_filter


@dataclass
class TokenProbs:
    """What ``n_probs`` reports for one position: the chosen token's probability and the
    ``n`` most likely tokens (most likely first, ties by lower id)."""

    token: int
    prob: float
    top: list[tuple[int, float]]


class SamplerChain:
    """Builds p for one request. Row ``i`` of a block of logits sees the history
    ``history + appended[:i]`` (the sequence as it would be had the earlier rows' tokens been
    emitted), which is how a verify round evaluates drafted positions.

    ``dry_breakers`` overrides the token-level DRY sequence breakers; by default they are
    derived from ``params.dry_sequence_breakers`` through ``tokenizer`` (none without one)."""

    def __init__(self, params: SamplerParams, *, vocab_size: int, eos_token_ids=(), tokenizer=None,
                 dry_breakers: DryBreakers | None = None):
        self.params = params
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer = tokenizer
        p = params
        bias = {int(t): float(b) for t, b in p.logit_bias.items() if 0 <= int(t) < vocab_size}
        if p.ignore_eos:
            for t in self.eos_token_ids:
                if 0 <= t < vocab_size:
                    bias[t] = NEG_INF
        self._bias = None
        if bias:
            self._bias = (mx.array(list(bias.keys()), dtype=mx.int32), mx.array(list(bias.values()), dtype=mx.float32))
        self._penalties = penalties_enabled(p.repeat_last_n, p.repeat_penalty, p.presence_penalty, p.frequency_penalty)
        self._dry = dry_enabled(p.dry_multiplier, p.dry_base, p.dry_penalty_last_n)
        self._dry_breakers = dry_breakers
        if self._dry and dry_breakers is None:
            self._dry_breakers = (breakers_from_strings(tokenizer, p.dry_sequence_breakers, vocab_size)
                                  if tokenizer is not None else DryBreakers())
        self._min_keep = max(int(p.min_keep), 1)
        self._filters = (0 < p.top_k < vocab_size or p.typical_p < 1.0 or p.top_p < 1.0 or p.min_p > 0.0
                         or xtc_enabled(p.xtc_probability, p.xtc_threshold))

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    # -- steps 1-2 ---------------------------------------------------------------------------

    def adjusted_logits(self, logits: mx.array, history: Sequence[int], appended: Sequence[int] = (),
                        allowed: mx.array | None = None) -> mx.array:
        """Logits after token bias, penalties, DRY and the grammar mask ``allowed`` (``[N, V]``
        booleans, or None), shape ``[N, V]`` float32."""
        p = self.params
        x = logits.astype(mx.float32)
        if x.ndim == 1:
            x = x[None]
        if self._bias is not None:
            ids, vals = self._bias
            x = x.at[:, ids].add(vals)
        if self._penalties:
            x = apply_penalties(x, history, appended, p.repeat_last_n, p.repeat_penalty, p.presence_penalty,
                                p.frequency_penalty)
        if self._dry:
            x = apply_dry(x, history, appended, self._dry_breakers, p.dry_multiplier, p.dry_base,
                          p.dry_allowed_length, p.dry_penalty_last_n)
        if allowed is not None:
            x = mx.where(allowed, x, NEG_INF)
        return x

    # -- steps 3-5 ---------------------------------------------------------------------------

    @property
    def shape(self) -> StageShape:
        """Which of steps 3-5 this chain runs (rows of chains of one shape share one graph in
        ``batch_select``, each with its own ``StageValues``)."""
        p = self.params
        if self.greedy:
            return StageShape(greedy=True)
        k = p.top_k if 0 < p.top_k < self.vocab_size else 0
        return StageShape(False, self._filters, k, p.typical_p < 1.0, p.top_p < 1.0, p.min_p > 0.0,
                          xtc_enabled(p.xtc_probability, p.xtc_threshold))

    def filtered(self, adjusted: mx.array, seed: int = 0, first_position: int = 0) -> Candidates:
        """The candidates surviving top-k, typical-p, top-p, min-p and XTC (untempered)."""
        shape, n = self.shape, adjusted.shape[0]
        coins = xtc_coins(seed, first_position, n) if shape.xtc else None
        return filter_rows(adjusted, shape, StageValues.of([(self, n)], shape), coins)

    def distribution(self, logits: mx.array, history: Sequence[int], appended: Sequence[int] = (),
                     seed: int = 0, first_position: int = 0, allowed: mx.array | None = None) -> mx.array:
        """The effective distribution p, shape ``[N, V]`` float32 (rows sum to 1). Under greedy
        params this is the one-hot of ``select``'s argmax."""
        x = self.adjusted_logits(logits, history, appended, allowed)
        shape, n = self.shape, x.shape[0]
        coins = xtc_coins(seed, first_position, n) if shape.xtc else None
        return distribution_rows(x, shape, StageValues.of([(self, n)], shape), coins)

    def pick(self, logits: mx.array, history: Sequence[int], appended: Sequence[int] = (),
             seed: int = 0, first_position: int = 0, allowed: mx.array | None = None) -> mx.array:
        """One token per row as a lazy ``[N]`` array: argmax of the adjusted logits when greedy, else
        a draw from p with the key of the row's absolute position (``first_position + i``). Lazy,
        so a decode loop can queue the next forward on it before reading it back."""
        if self.greedy:
            return argmax_last(self.adjusted_logits(logits, history, appended, allowed))
        probs = self.distribution(logits, history, appended, seed, first_position, allowed)
        return sample_rows(probs, seed, first_position)

    def select(self, logits: mx.array, history: Sequence[int], appended: Sequence[int] = (),
               seed: int = 0, first_position: int = 0, allowed: mx.array | None = None) -> list[int]:
        """``pick``, read back as token ids."""
        return self.pick(logits, history, appended, seed, first_position, allowed).tolist()

    # -- n_probs -----------------------------------------------------------------------------

    def token_probs(self, logits: mx.array, tokens: Sequence[int], n: int, *, post_sampling: bool,
                    history: Sequence[int] = (), appended: Sequence[int] = (), seed: int = 0,
                    first_position: int = 0, log_probs: bool = False,
                    allowed: mx.array | None = None) -> list[TokenProbs]:
        """Per row: the probability of ``tokens[i]`` and the top ``n`` tokens.

        ``post_sampling=False`` (llama-server's default) reports the model's raw distribution,
        ``softmax(logits)`` with no bias, penalty, filter or temperature (as log-probabilities with
        ``log_probs``, computed in the log domain so tiny probabilities do not underflow);
        ``post_sampling=True`` reports the effective distribution p (the grammar mask ``allowed``
        included) and lists only tokens p keeps."""
        x = logits.astype(mx.float32)
        if x.ndim == 1:
            x = x[None]
        if post_sampling:
            probs = self.distribution(x, history, appended, seed, first_position, allowed)
        elif log_probs:
            probs = x - mx.logsumexp(x, axis=-1, keepdims=True)
        else:
            probs = mx.softmax(x, axis=-1, precise=True)
        rows = probs.shape[0]
        want = max(0, int(n))
        chosen = probs[mx.arange(rows), mx.array([int(t) for t in tokens[:rows]], dtype=mx.int32)]
        top = top_candidates(probs, max(1, min(want, probs.shape[-1])))
        chosen, top_ids, top_probs = (a.tolist() for a in (chosen, top.ids, top.values))
        out = []
        for i in range(rows):
            pairs = [(t, q) for t, q in zip(top_ids[i], top_probs[i]) if q > 0.0 or not post_sampling]
            out.append(TokenProbs(int(tokens[i]), chosen[i], pairs[:want]))
        return out


@dataclass(frozen=True)
class StageShape:
    """Which of steps 3-5 a chain runs, and top-k's ``k`` (0: every token): what decides the ops of
    its graph. Rows of chains with one shape go through one graph, each row with its own values."""

    greedy: bool
    filters: bool = False  # any truncation or XTC (else plain ``softmax(x / T)``)
    top_k: int = 0
    typical: bool = False
    top_p: bool = False
    min_p: bool = False
    xtc: bool = False


@dataclass
class StageValues:
    """Per-row values of steps 3-5 as ``[N, 1]`` columns (only those the shape reads; None
    otherwise). A column holds exactly the float32 / int32 a Python scalar of the same value
    becomes in an MLX op, so a row's ops give the same bits whatever rows sit beside it."""

    temperature: mx.array | None = None  # [N, 1] float32
    typical_p: mx.array | None = None  # [N, 1] float32
    top_p: mx.array | None = None  # [N, 1] float32
    log_min_p: mx.array | None = None  # [N, 1] float32
    xtc_probability: mx.array | None = None  # [N, 1] float32
    xtc_threshold: mx.array | None = None  # [N, 1] float32
    min_keep: mx.array | None = None  # [N, 1] int32, at least 1

    @classmethod
    def of(cls, blocks: Sequence[tuple[SamplerChain, int]], shape: StageShape) -> StageValues:
        """The columns of ``blocks`` stacked: ``(chain, rows)`` gives ``rows`` rows of that chain."""
        if shape.greedy:
            return cls()

        def column(value, dtype=mx.float32):
            return mx.array([v for chain, n in blocks for v in [value(chain)] * n], dtype=dtype)[:, None]

        truncates = shape.typical or shape.top_p or shape.min_p or shape.xtc
        return cls(
            temperature=column(lambda c: c.params.temperature),
            typical_p=column(lambda c: c.params.typical_p) if shape.typical else None,
            top_p=column(lambda c: c.params.top_p) if shape.top_p else None,
            log_min_p=column(lambda c: math.log(c.params.min_p)) if shape.min_p else None,
            xtc_probability=column(lambda c: c.params.xtc_probability) if shape.xtc else None,
            xtc_threshold=column(lambda c: c.params.xtc_threshold) if shape.xtc else None,
            min_keep=column(lambda c: c._min_keep, mx.int32) if truncates else None,
        )


def filter_rows(adjusted: mx.array, shape: StageShape, values: StageValues, coins: mx.array | None) -> Candidates:
    """Steps 3-4 over ``adjusted [N, V]``: the candidates surviving top-k, typical-p, top-p, min-p
    and XTC (``coins [N]``: each row's XTC coin), every row with its own values."""
    c = top_candidates(adjusted, shape.top_k)
    if shape.typical:
        c.alive = typical_filter(c, values.typical_p, values.min_keep)
    if shape.top_p:
        c.alive = top_p_filter(c, values.top_p, values.min_keep)
    if shape.min_p:
        c.alive = min_p_filter(c, values.log_min_p, values.min_keep)
    if shape.xtc:
        c.alive = xtc_filter(c, values.xtc_probability, values.xtc_threshold, values.min_keep, coins)
    return c


def distribution_rows(adjusted: mx.array, shape: StageShape, values: StageValues,
                      coins: mx.array | None) -> mx.array:
    """Steps 3-5 over ``adjusted [N, V]``: p ``[N, V]`` float32, every row with its own values
    (``SamplerChain.distribution`` is this over one chain's rows)."""
    if shape.greedy:
        return (mx.arange(adjusted.shape[-1]) == adjusted.argmax(axis=-1, keepdims=True)).astype(mx.float32)
    if not shape.filters:  # plain temperature sampling: no order needed
        return mx.softmax(adjusted / values.temperature, axis=-1)
    c = filter_rows(adjusted, shape, values, coins)
    tempered = mx.where(c.alive, c.values / values.temperature, NEG_INF)
    probs = mx.softmax(tempered, axis=-1)
    return mx.put_along_axis(mx.zeros(adjusted.shape, dtype=mx.float32), c.ids, probs, axis=-1)


def _inverse_cdf(probs: mx.array, key: mx.array) -> mx.array:
    """One draw from a probability row by inverting its CDF with a single uniform.

    One random number and a cumulative sum instead of a Gumbel variate per vocabulary entry
    (what ``mx.random.categorical`` does): much cheaper on large vocabularies. ``u`` lies in
    ``(0, total]``, so a token with zero probability (an empty CDF step) is never chosen."""
    cdf = mx.cumsum(probs.astype(mx.float32), axis=-1)
    u = (1.0 - mx.random.uniform(key=key)) * cdf[-1]
    return mx.minimum(mx.sum(cdf < u), probs.shape[-1] - 1).astype(mx.int32)


def draw_one(probs: mx.array, key: mx.array) -> mx.array:
    """``sample``, lazy: the draw as a 0-d int32 array."""
    return _inverse_cdf(probs, key)


def sample(probs: mx.array, key: mx.array) -> int:
    """Draw one token from a probability row with an explicit key."""
    return int(_inverse_cdf(probs, key).item())


def position_keys(seed: int, first_position: int, rows: int, stream: int = 0) -> mx.array:
    """``[rows, 2]``: the keys of positions ``first_position .. first_position + rows - 1``."""
    return mx.stack([position_key(seed, first_position + i, stream) for i in range(rows)])


_inverse_cdf_rows = mx.vmap(_inverse_cdf)


def draw_rows(probs: mx.array, keys: mx.array) -> mx.array:
    """``[N]`` lazy draws from ``probs [N, V]``, row ``i`` with ``keys[i]``."""
    return _inverse_cdf_rows(probs, keys)


def sample_rows(probs: mx.array, seed: int, first_position: int) -> mx.array:
    """``[N]`` lazy draws, row ``i`` with ``position_key(seed, first_position + i)``: row for row
    the same draw as ``sample(probs[i], key)``, as one vectorised op."""
    return draw_rows(probs, position_keys(seed, first_position, probs.shape[0]))
