"""The extension's flat-row primitives (engine/platform/ragged_ops.py): per-token rope and ragged
attention give each token / query the bits the fused single-sequence ops give it, whatever the other
rows, their lengths or the key capacity."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.fused_layers import FusedRoPE
from mlxcel.engine.platform.ragged_ops import ragged_attention, rope_positions

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_positions_is_the_fused_rope_token_by_token(traditional):
    rope = FusedRoPE(nn.RoPE(48, traditional=traditional, base=10000.0, scale=0.5))
    x = mx.random.normal((7, 3, 64), key=mx.random.key(0))
    positions = [5, 6, 0, 40, 41, 42, 3]
    got = rope_positions(x, mx.array(positions, dtype=mx.int32), rope)
    for i, p in enumerate(positions):
        want = rope(x[i][None, :, None, :], offset=p)[0, :, 0]
        assert mx.array_equal(got[i], want).item(), i


def test_ragged_attention_is_the_fused_attention_row_by_row():
    ext = qmatmul.extension()
    lengths, counts = [9, 0, 30], [3, 5, 1]  # keys already held, then the new queries of each row
    cap = 64
    k = mx.random.normal((3, 2, cap, 16), key=mx.random.key(1))
    v = mx.random.normal((3, 2, cap, 16), key=mx.random.key(2))
    q = mx.random.normal((sum(counts), 6, 16), key=mx.random.key(3))
    rows = [i for i, c in enumerate(counts) for _ in range(c)]
    positions = [lengths[i] + t for i, c in enumerate(counts) for t in range(c)]
    got = ragged_attention(q, k, v, mx.array(rows, dtype=mx.int32), mx.array(positions, dtype=mx.int32), 0.25)
    # strided keys (a transposed token-major cache) give the same
    kt, vt = mx.contiguous(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3), mx.contiguous(v.transpose(0, 2, 1, 3))
    got_t = ragged_attention(q, kt, vt.transpose(0, 2, 1, 3), mx.array(rows, dtype=mx.int32),
                             mx.array(positions, dtype=mx.int32), 0.25)
    assert mx.array_equal(got, got_t).item()
    at = 0
    for i, c in enumerate(counts):
        end = lengths[i] + c
        qi = q[at:at + c].transpose(1, 0, 2)[None]  # [1, hq, c, d]
        want = ext.attention(qi, k[i:i + 1, :, :end], v[i:i + 1, :, :end], 0.25, True)[0].transpose(1, 0, 2)
        assert mx.array_equal(got[at:at + c], want).item(), i
        at += c
