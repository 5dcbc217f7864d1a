"""A rank other than 0 of a distributed ``mlxcel-server`` (started by ``mlx.launch``): no HTTP;
it loads its shard, checks with the other ranks that they all loaded the same, and runs the same
scheduler as rank 0 in lockstep on this thread (``runtime.lockstep.Follower``) until rank 0 stops
or the group is lost."""

from __future__ import annotations

import logging

from mlxcel.server.http.startup import build_scheduler
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.distributed_setup import load_shard
from mlxcel.server.runtime.lockstep import Follower
from mlxcel.server.runtime.speculation import Speculation
from mlxcel.server.runtime.speculation_settings import resolve

log = logging.getLogger("mlxcel.server")


def run(config: ServerConfig, group) -> int:
    loaded = load_shard(config, group)
    settings = resolve(config)
    speculation = (Speculation.load(settings, loaded, config.ubatch_size, measure_cost=False)
                   if settings is not None else None)
    scheduler = build_scheduler(config, loaded, speculation)
    follower = Follower(group)
    scheduler.lockstep = follower
    log.info("rank %d: %s loaded; following rank 0", group.rank(), loaded.name)
    scheduler._run()  # the engine loop on this thread; ends when rank 0 stops or is lost
    return follower.exit_code
