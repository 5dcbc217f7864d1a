"""The few collectives the lockstep layer needs, on MLX's own ``all_sum``.

MLX's distributed API has no broadcast; rank 0's bytes reach every rank as an ``all_sum`` in
which the other ranks contribute zeros. Every function here must be called by every rank, in the
same order, with arrays of the same shape: that is what keeps the ranks in step."""

from __future__ import annotations

import mlx.core as mx

from mlxcel.engine.distributed.world import DistributedError


def sum_ints(group: mx.distributed.Group, values: list[int]) -> list[int]:
    """Every rank's ``values`` summed element-wise (int32), on every rank."""
    out = mx.distributed.all_sum(mx.array(values, dtype=mx.int32), group=group)
    mx.eval(out)
    return out.tolist()


def broadcast_bytes(group: mx.distributed.Group, payload: bytes | None, length: int) -> bytes:
    """Rank 0's ``payload`` (``length`` bytes, already agreed on) on every rank."""
    if length == 0:
        return b""
    if group.rank() == 0:
        if payload is None or len(payload) != length:
            raise DistributedError("rank 0 must give the payload it announced")
        data = mx.array(memoryview(payload), dtype=mx.uint8)
    else:
        data = mx.zeros((length,), dtype=mx.uint8)
    out = mx.distributed.all_sum(data, group=group)
    mx.eval(out)
    return bytes(memoryview(out))


def gather_ints(group: mx.distributed.Group, values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (the same length everywhere), indexed by rank, on every rank."""
    n, width = group.size(), len(values)
    row = [0] * (n * width)
    row[group.rank() * width:(group.rank() + 1) * width] = values
    flat = sum_ints(group, row)
    return [flat[r * width:(r + 1) * width] for r in range(n)]
