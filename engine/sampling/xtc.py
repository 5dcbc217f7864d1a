"""XTC ("exclude top choices"): sometimes remove the most likely tokens.

On the renormalised filtered row, with probability ``xtc_probability``: if at least two
candidates have ``p >= xtc_threshold``, remove all of them except the least likely one (so
the row keeps one "safe" high-probability choice plus the tail). As in llama.cpp, a threshold
above 0.5 disables it (at most one token can clear it) and ``min_keep`` candidates survive.

The coin of row ``i`` is a uniform drawn with ``position_key(seed, position, XTC_STREAM)``, a
pure function of the absolute position, so a verify block and one-token decoding flip the same
coin for the same position.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcel.engine.sampling.filters import Candidates, alive_rank, masked_softmax
from mlxcel.engine.sampling.random_keys import position_key

XTC_STREAM = 3

_uniform_rows = mx.vmap(lambda key: mx.random.uniform(key=key))


def xtc_enabled(probability: float, threshold: float) -> bool:
    return probability > 0.0 and threshold <= 0.5


def xtc_coins(seed: int, first_position: int, rows: int) -> mx.array:
    """``[rows]`` uniforms in [0, 1), one per absolute position ``first_position + i``."""
    keys = mx.stack([position_key(seed, first_position + i, XTC_STREAM) for i in range(rows)])
    return _uniform_rows(keys)


def xtc_filter(c: Candidates, probability: float | mx.array, threshold: float | mx.array, min_keep: int | mx.array,
               coins: mx.array) -> mx.array:
    """The alive mask after XTC; ``coins [N]`` decide which rows it fires on (``coin <= probability``).
    The values are scalars or ``[N, 1]`` columns, one per row."""
    p = masked_softmax(c.values, c.alive)
    n_alive = mx.sum(c.alive, axis=-1, keepdims=True)
    n_above = mx.sum(c.alive & (p >= threshold), axis=-1, keepdims=True)
    fires = (coins[:, None] <= probability) & (n_above >= 2) & (n_alive - (n_above - 1) >= min_keep)
    removed = fires & (alive_rank(c.alive) < n_above - 1)
    return c.alive & ~removed
