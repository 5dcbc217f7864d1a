"""--split-mode / --tensor-split as a distributed run reads them (no group needed)."""

from __future__ import annotations

import pytest

from mlxcel.engine.distributed.agreement import digest
from mlxcel.engine.distributed.sharding import parse_tensor_split, split_mode_of
from mlxcel.engine.distributed.world import DistributedError


def test_split_modes():
    assert split_mode_of(None) == "row" and split_mode_of("tensor") == "row" and split_mode_of("LAYER") == "layer"
    with pytest.raises(DistributedError, match="must be split"):
        split_mode_of("none")


def test_tensor_split_needs_one_positive_share_per_rank():
    assert parse_tensor_split(None, 2) is None
    assert parse_tensor_split("3,1", 2) == [3.0, 1.0]
    for bad in ("1", "1,0", "a,b", "1,1,1"):
        with pytest.raises(DistributedError):
            parse_tensor_split(bad, 2)


def test_the_agreement_digest_tells_descriptions_apart():
    a = {"model": {"config": {"hidden_size": 64}, "files": [["m.safetensors", 10]]}, "argv": ["-m", "x"]}
    b = {"model": {"config": {"hidden_size": 64}, "files": [["m.safetensors", 11]]}, "argv": ["-m", "x"]}
    assert digest(a) == digest(dict(reversed(list(a.items()))))
    assert digest(a) != digest(b)
