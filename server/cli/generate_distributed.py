"""``mlxcel generate`` under ``mlx.launch``: every rank runs the same decode on its shard.

A single sequence needs no step plan: every rank runs the same command on the same prompt, so
each step's forward is the same collective on every rank, and the logits (the sum of the shards)
are bitwise the same everywhere, hence the tokens. What must be shared is what is not a function
of the command line: a random seed (rank 0's is taken). The ranks check at load that they hold the
same model and command line; only rank 0 writes to stdout.

A run that cannot go on across ranks ends in one ``error:`` line and exit status 1, never a
traceback: a refusal of the split, a bad ``--tensor-split`` or a disagreement between the ranks is
reached the same way by every rank (it depends on the command line, the checkpoint and the group
size alone), so rank 0 says it and the other ranks exit quietly. A ``--split-mode`` the model
cannot take, where the other mode works, is not a refusal: the other mode is used, with a one-line
notice (``engine.distributed.split_choice``)."""

from __future__ import annotations

import argparse
import os
import sys

import mlx.core as mx

from mlxcel.drafters.loading import load_target
from mlxcel.engine.distributed.agreement import check_same, model_description
from mlxcel.engine.distributed.collectives import sum_ints
from mlxcel.engine.distributed.sharding import parse_tensor_split, split_mode_of, unpacked_loading
from mlxcel.engine.distributed.split_choice import falling_back_sharder
from mlxcel.engine.distributed.world import DistributedError, world
from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.random_keys import resolve_seed


class DistributedRunError(MlxcelError):
    """A distributed run that cannot go on; the command prints its message as one ``error:`` line."""


def add_distributed_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("across ranks (under mlx.launch; see docs/distributed.md)")
    group.add_argument("-sm", "--split-mode", default=None,
                       help="row (tensor parallel, the default with several ranks) or layer (pipeline parallel); "
                            "a model that cannot be split the asked way is split the other way, with a notice")
    group.add_argument("-ts", "--tensor-split", default=None,
                       help="proportions per rank, e.g. 3,1 (layers per rank with --split-mode layer)")
    return parser


def load_generate_target(args: argparse.Namespace, argv: list[str]) -> LoadedModel:
    """The target, or this rank's shard of it; on a distributed run the seed is made common and
    every rank but 0 stops writing to stdout."""
    try:
        group = world()
    except DistributedError as exc:  # no group to agree through: each rank says why it has none
        raise DistributedRunError(str(exc)) from None
    if group is None:
        return load_target(args.model, hf_repo=args.hf_repo, hf_file=args.hf_file)
    try:
        loaded = _load_shard(args, argv, group)
    except DistributedError as exc:
        if group.rank() != 0:  # rank 0 reached the same refusal and says it
            raise SystemExit(1) from None
        raise DistributedRunError(str(exc)) from None
    seed = resolve_seed(args.seed) & 0x7FFFFFFF if group.rank() == 0 else 0
    args.seed = sum_ints(group, [seed])[0]
    if group.rank() != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    return loaded


def _load_shard(args: argparse.Namespace, argv: list[str], group: mx.distributed.Group) -> LoadedModel:
    """This rank's shard, split as asked or the other way (with a notice from rank 0), checked
    against every other rank's."""
    mode = split_mode_of(args.split_mode)
    tensor_split = parse_tensor_split(args.tensor_split, group.size())
    unpacked_loading()
    shard = falling_back_sharder(group, mode, tensor_split, notice=_notice if group.rank() == 0 else _quiet)
    loaded = load_target(args.model, hf_repo=args.hf_repo, hf_file=args.hf_file, shard=shard)
    check_same(group, {"model": model_description(loaded.config, loaded.path), "argv": argv})
    return loaded


def _notice(line: str) -> None:
    print(f"note: {line}", file=sys.stderr, flush=True)


def _quiet(line: str) -> None:
    pass
