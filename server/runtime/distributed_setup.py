"""What a rank of a distributed server loads, checks and refuses (``mlx.launch`` with N ranks).

Shared by rank 0 (``http.startup``) and the other ranks (``cli.follower``) so that both load the
same shard of the same model with the same checks: the group, the split (``--split-mode`` /
``--tensor-split``), the startup agreement over the model and the command line."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from mlxcel.drafters.loading import load_target
from mlxcel.engine.distributed.agreement import check_same, model_description
from mlxcel.engine.distributed.sharding import parse_tensor_split, sharder, split_mode_of, unpacked_loading
from mlxcel.engine.distributed.world import DistributedError, world
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.server.runtime.config import ServerConfig


def refusals(config: ServerConfig) -> str | None:
    """Why this command line cannot be served across ranks (None: it can)."""
    if config.router:
        return "router mode cannot run under mlx.launch; start one model per distributed server"
    if config.embeddings or config.reranking:
        return ("--embeddings / --reranking are not served across ranks (their forwards would run on rank 0 "
                "alone); serve them from a single-process server")
    if config.sleep_idle_seconds > 0:
        return "--sleep-idle-seconds cannot unload a model that is split across ranks"
    if config.lora_adapters:
        return ("--lora / --lora-scaled are not served across ranks (the adapters are not sharded with the model); "
                "serve them from a single-process server")
    try:
        split_mode_of(config.split_mode)
        group = world()
        parse_tensor_split(config.tensor_split, group.size() if group is not None else 1)
    except DistributedError as exc:
        return str(exc)
    return None


def shard_hook(config: ServerConfig, group: mx.distributed.Group) -> Callable[[nn.Module], None]:
    unpacked_loading()
    return sharder(group, split_mode_of(config.split_mode), parse_tensor_split(config.tensor_split, group.size()))


def load_shard(config: ServerConfig, group: mx.distributed.Group) -> LoadedModel:
    """This rank's shard of the configured model, checked against every other rank's."""
    loaded = load_target(config.model, hf_repo=config.hf_repo, hf_file=config.hf_file,
                         shard=shard_hook(config, group))
    agree(config, loaded, group)
    return loaded


def agree(config: ServerConfig, loaded: LoadedModel, group: mx.distributed.Group) -> None:
    """Raise on every rank unless all loaded the same checkpoint with the same command line."""
    check_same(group, {"model": model_description(loaded.config, loaded.path), "argv": config.argv})
