"""The distributed group this process belongs to, if it was started by ``mlx.launch``.

``mlx.launch`` (ring, MPI or NCCL backend) gives every rank the environment its backend reads
(``MLX_RANK`` with ``MLX_HOSTFILE`` for the ring, ``OMPI_*``/``PMI_*`` under MPI, ``MLX_JACCL_*``
or ``NCCL_*`` hosts...). A process started without it is a group of one, and nothing about
distribution applies to it."""

from __future__ import annotations

import functools
import os

import mlx.core as mx

# what mlx.launch (or mpirun) sets for every rank; one of them is enough to try the backends
_LAUNCH_VARS = ("MLX_RANK", "MLX_HOSTFILE", "MLX_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MLX_JACCL_COORDINATOR",
                "NCCL_HOST_IP")


class DistributedError(RuntimeError):
    """A problem with the group itself: it cannot start, the ranks disagree, or a rank is gone."""


@functools.cache
def world() -> mx.distributed.Group | None:
    """The group of every rank ``mlx.launch`` started, or None for a process on its own (a group of
    one counts as on its own). Initialised once; a backend that cannot start is an error, not a
    silent fallback to one process serving alone."""
    if not any(os.environ.get(name) for name in _LAUNCH_VARS):
        return None
    try:
        group = mx.distributed.init(strict=True)
    except Exception as exc:  # the ring cannot connect, no backend is built in
        raise DistributedError(f"could not join the distributed group started by mlx.launch: {exc}") from exc
    return group if group.size() > 1 else None


def rank() -> int:
    group = world()
    return group.rank() if group is not None else 0


def is_follower() -> bool:
    """Whether this process is a rank other than 0 (it serves no HTTP and prints nothing)."""
    return rank() != 0
