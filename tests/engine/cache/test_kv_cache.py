"""Exact KV-cache rewind: after rewinding by k, the model continues exactly as if it had only
ever seen the shorter sequence; a cache that cannot do that refuses."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    ConcatenateKVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from mlxcel.engine.cache.kv_cache import cache_length, can_rewind, rewind
from mlxcel.engine.errors import CacheRewindError

TOL = 1e-4


def tokens(n: int, seed: int = 0, vocab: int = 300) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, vocab, size=n)]


def feed(model, cache, toks: list[int], chunk: int) -> mx.array:
    """Run ``toks`` through the model in chunks; return the last position's logits."""
    logits = None
    for i in range(0, len(toks), chunk):
        logits = model(mx.array(toks[i : i + chunk])[None], cache=cache)[0, -1]
    mx.eval(logits)
    return logits


def assert_close(a: mx.array, b: mx.array) -> None:
    diff = float(mx.abs(a - b).max())
    assert diff < TOL, f"max |diff| = {diff}"


def check_rewind_matches_fresh(model, make_cache, seq: list[int], k: int, chunk: int = 4, then: int = 6):
    """Prefill ``seq`` and rewind k; then (a) a multi-token block (a verify round's shape) and
    (b) ``then`` single tokens must give the logits a fresh cache fed the shorter sequence gives."""
    kept = seq[: len(seq) - k]
    extra = tokens(then, seed=99)

    def rewound():
        cache = make_cache()
        feed(model, cache, seq, chunk)
        assert cache_length(cache) == len(seq)
        assert can_rewind(cache, k)
        rewind(cache, k)
        assert cache_length(cache) == len(kept)
        return cache

    def fresh():
        cache = make_cache()
        feed(model, cache, kept, chunk)
        return cache

    got = model(mx.array(extra)[None], cache=rewound())[0]
    want = model(mx.array(extra)[None], cache=fresh())[0]
    assert_close(got, want)
    a, b = rewound(), fresh()
    for t in extra:
        assert_close(feed(model, a, [t], 1), feed(model, b, [t], 1))


def test_kvcache_rewind_is_exact(tiny_llama):
    model = tiny_llama.model
    seq = tokens(21)
    for k in (1, 3, 8):
        check_rewind_matches_fresh(model, tiny_llama.make_cache, seq, k)


def test_kvcache_rewind_detects_a_wrong_rewind(tiny_llama):
    """Power check: the comparison above is sensitive — an off-by-one rewind is caught."""
    model = tiny_llama.model
    seq = tokens(21)
    cache = tiny_llama.make_cache()
    feed(model, cache, seq, 4)
    rewind(cache, 4)  # but compare against a sequence that dropped only 3
    fresh = tiny_llama.make_cache()
    feed(model, fresh, seq[:-3], 4)
    got, want = feed(model, cache, [7], 1), feed(model, fresh, [7], 1)
    assert float(mx.abs(got - want).max()) > 1e-2


def test_concatenate_cache_rewinds_exactly(tiny_llama):
    """mlx-lm's own ConcatenateKVCache.trim leaves dropped entries visible; ours slices them off."""
    model = tiny_llama.model
    n = len(model.layers)
    check_rewind_matches_fresh(model, lambda: [ConcatenateKVCache() for _ in range(n)], tokens(17, seed=3), 5)


def test_quantized_cache_rewinds_exactly():
    """QuantizedKVCache needs head_dim >= 32 (the tiny models have 16): drive it directly."""
    kv = [mx.random.normal((1, 2, 9, 64), key=mx.random.key(i)) for i in range(4)]
    cache, fresh = QuantizedKVCache(group_size=32, bits=8), QuantizedKVCache(group_size=32, bits=8)
    cache.update_and_fetch(kv[0], kv[1])
    rewind([cache], 4)
    fresh.update_and_fetch(kv[0][..., :5, :], kv[1][..., :5, :])
    got = cache.update_and_fetch(kv[2], kv[3])
    want = fresh.update_and_fetch(kv[2], kv[3])
    assert cache_length([cache]) == 14
    for g, w in zip(mx.concatenate([*got[0], *got[1]], -1), mx.concatenate([*want[0], *want[1]], -1)):
        assert mx.array_equal(g, w)


def test_rotating_cache_rewinds_exactly_inside_its_window(tiny_llama):
    """A sliding-window cache that has not wrapped rewinds exactly, including at the boundary
    (offset == window) and when the continuation then wraps past the window."""
    model = tiny_llama.model
    n = len(model.layers)
    window = 12
    make = lambda: [RotatingKVCache(max_size=window) for _ in range(n)]  # noqa: E731
    check_rewind_matches_fresh(model, make, tokens(9, seed=4), 3, then=10)
    check_rewind_matches_fresh(model, make, tokens(window, seed=5), 2, then=10)
    # Token-by-token fill exactly to the window, then rewind.
    cache, fresh = make(), make()
    seq = tokens(window, seed=6)
    feed(model, cache, seq, 1)
    rewind(cache, 4)
    feed(model, fresh, seq[:-4], 1)
    for t in tokens(9, seed=7):
        assert_close(feed(model, cache, [t], 1), feed(model, fresh, [t], 1))


def test_rotating_cache_refuses_once_wrapped(tiny_llama):
    model = tiny_llama.model
    n = len(model.layers)
    cache = [RotatingKVCache(max_size=8) for _ in range(n)]
    feed(model, cache, tokens(11, seed=8), 1)
    assert cache_length(cache) == 11
    assert not can_rewind(cache, 1)
    assert can_rewind(cache, 0)
    with pytest.raises(CacheRewindError, match="wrapped"):
        rewind(cache, 1)
    assert cache_length(cache) == 11  # untouched


def test_mixed_sliding_window_model(tiny_llama_dir, tmp_path):
    """A checkpoint whose own make_cache mixes full and sliding-window layers."""
    from mlxcel.engine.model.loading import load_model

    d = tmp_path / "tiny-swa"
    shutil.copytree(tiny_llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(sliding_window=10, layer_types=["sliding_attention", "full_attention"])
    (d / "config.json").write_text(json.dumps(cfg))
    lm = load_model(d)
    kinds = {type(c).__name__ for c in lm.make_cache()}
    assert kinds == {"RotatingKVCache", "KVCache"}
    check_rewind_matches_fresh(lm.model, lm.make_cache, tokens(8, seed=9), 3, then=12)
    cache = lm.make_cache()
    feed(lm.model, cache, tokens(14, seed=10), 1)
    with pytest.raises(CacheRewindError):
        rewind(cache, 2)


def test_refusals_leave_the_cache_untouched(tiny_llama):
    model = tiny_llama.model
    cache = tiny_llama.make_cache()
    feed(model, cache, tokens(5), 5)
    with pytest.raises(CacheRewindError, match="holds only 5"):
        rewind(cache, 6)
    with pytest.raises(CacheRewindError):
        rewind(cache, -1)
    assert cache_length(cache) == 5
    state = ArraysCache(2)
    state[0] = mx.zeros((1, 4))
    assert not can_rewind([state], 1)
    with pytest.raises(CacheRewindError, match="recurrent"):
        rewind([state], 1)
    rewind([state], 0)
