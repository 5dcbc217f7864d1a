"""``mlxcel generate`` under ``mlx.launch``: every rank runs the same decode on its shard.

A single sequence needs no step plan: every rank runs the same command on the same prompt, so
each step's forward is the same collective on every rank, and the logits (the sum of the shards)
are bitwise the same everywhere, hence the tokens. What must be shared is what is not a function
of the command line: a random seed (rank 0's is taken). The ranks check at load that they hold the
same model and command line; only rank 0 writes to stdout."""

from __future__ import annotations

import argparse
import os
import sys

from mlxcel.drafters.loading import load_target
from mlxcel.engine.distributed.agreement import check_same, model_description
from mlxcel.engine.distributed.collectives import sum_ints
from mlxcel.engine.distributed.sharding import parse_tensor_split, sharder, split_mode_of, unpacked_loading
from mlxcel.engine.distributed.world import world
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.random_keys import resolve_seed


def add_distributed_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("across ranks (under mlx.launch; see docs/distributed.md)")
    group.add_argument("-sm", "--split-mode", default=None,
                       help="row (tensor parallel, the default with several ranks) or layer (pipeline parallel)")
    group.add_argument("-ts", "--tensor-split", default=None,
                       help="proportions per rank, e.g. 3,1 (layers per rank with --split-mode layer)")
    return parser


def load_generate_target(args: argparse.Namespace, argv: list[str]) -> LoadedModel:
    """The target, or this rank's shard of it; on a distributed run the seed is made common and
    every rank but 0 stops writing to stdout."""
    group = world()
    if group is None:
        return load_target(args.model, hf_repo=args.hf_repo, hf_file=args.hf_file)
    unpacked_loading()
    shard = sharder(group, split_mode_of(args.split_mode), parse_tensor_split(args.tensor_split, group.size()))
    loaded = load_target(args.model, hf_repo=args.hf_repo, hf_file=args.hf_file, shard=shard)
    check_same(group, {"model": model_description(loaded.config, loaded.path), "argv": argv})
    seed = resolve_seed(args.seed) & 0x7FFFFFFF if group.rank() == 0 else 0
    args.seed = sum_ints(group, [seed])[0]
    if group.rank() != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    return loaded
