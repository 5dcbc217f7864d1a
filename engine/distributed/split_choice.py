"""The split a distributed run ends up with: the ``--split-mode`` asked for, or the other one when
the model cannot be split the asked way but can be split the other, or one refusal naming both.

mlx-lm gives some families tensor parallelism only (llama has ``shard`` but no ``PipelineMixin``),
some pipeline parallelism only, and a head count that the ranks cannot divide rules out the row
split of a family that has one. A user who asked for the impossible mode still wants the model
served, so the other mode is tried and a one-line notice says what happened, the way a refusal is
one line (``docs/distributed.md``).

Trying the second mode on the same freshly built model is safe because ``sharding``'s refusals
are all raised by its checks before it cuts anything (``shard_rows`` / ``shard_layers`` check the
family, the head counts and ``--tensor-split`` first); a failure inside mlx-lm's own ``shard`` /
``pipeline`` is not a ``DistributedError`` and is not retried.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.distributed.sharding import sharder
from mlxcel.engine.distributed.world import DistributedError

OTHER_MODE = {"row": "layer", "layer": "row"}
NAMES = {"row": "row (tensor parallel)", "layer": "layer (pipeline parallel)"}
# the advice a single mode's refusal ends with ("try --split-mode row"), moot once both were tried
_HINT = re.compile(r"[;,] (try|or use) --split-mode \w+$")


class SplitRefused(DistributedError):
    """Neither split mode can cut this model across the group: the message gives both reasons."""


def falling_back_sharder(group: mx.distributed.Group, mode: str, tensor_split: list[float] | None,
                         notice: Callable[[str], None]) -> Callable[[nn.Module], None]:
    """The loader's ``shard`` hook for ``mode`` (``row`` or ``layer``, as ``split_mode_of`` gives it)
    that falls back to the other mode, calling ``notice`` with one line, when only that one works;
    when neither works it raises ``SplitRefused``."""
    def shard(model: nn.Module) -> None:
        try:
            sharder(group, mode, tensor_split)(model)
            return
        except DistributedError as asked:
            other = OTHER_MODE[mode]
            try:
                sharder(group, other, tensor_split)(model)
            except DistributedError as fallback:
                raise SplitRefused(f"this model cannot be split across {group.size()} ranks: {_reason(asked)}; "
                                   f"and {_reason(fallback)}") from None
            notice(f"{_reason(asked)}; split by {NAMES[other]} instead")
    return shard


def _reason(exc: DistributedError) -> str:
    return _HINT.sub("", str(exc))
