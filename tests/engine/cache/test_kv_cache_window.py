"""Rewinding a wrapped sliding-window cache right after a multi-token forward (what a verify round
does with its rejected drafts) leaves the cache a fresh prefill of the shorter sequence would
have: the next tokens' logits agree, over several wraps. Anything else on a wrapped window is
still refused."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny_drafters

from mlxcel.engine.cache.kv_cache import can_rewind, rewind
from mlxcel.engine.errors import CacheRewindError
from mlxcel.engine.model.loading import load_model

WINDOW = 8


@pytest.fixture(scope="module")
def muse(tmp_path_factory):
    return load_model(tiny_drafters.build_target(tmp_path_factory.mktemp("window") / "m", "muse_glimmer", seed=6,
                                                 window=WINDOW))


def test_dropping_the_newest_block_entries_equals_a_fresh_prefill(muse):
    tokens = mx.random.randint(0, muse.vocab_size, (60,), key=mx.random.key(1)).tolist()
    cache = muse.make_cache()
    muse.model(mx.array([tokens[:20]]), cache=cache)  # wrapped already (20 > 8)
    length = 20
    for block, drop in ((5, 3), (4, 0), (6, 5), (2, 1), (5, 4)):
        muse.model(mx.array([tokens[length:length + block]]), cache=cache)
        assert can_rewind(cache, drop)
        rewind(cache, drop)
        length += block - drop
        nxt = tokens[length]
        got = muse.model(mx.array([[nxt]]), cache=cache)[0, -1]
        fresh = muse.make_cache()
        muse.model(mx.array([tokens[:length]]), cache=fresh)
        want = muse.model(mx.array([[nxt]]), cache=fresh)[0, -1]
        assert mx.allclose(got, want, atol=1e-4).item(), (block, drop)
        length += 1


def test_a_wrapped_window_after_one_token_steps_is_still_refused(muse):
    cache = muse.make_cache()
    muse.model(mx.array([list(range(3, 15))]), cache=cache)
    for t in range(3):
        muse.model(mx.array([[20 + t]]), cache=cache)
    assert not can_rewind(cache, 1)
    with pytest.raises(CacheRewindError, match="wrapped"):
        rewind(cache, 1)
