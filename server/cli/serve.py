"""``mlxcel-server`` / ``mlxcel serve``: parse llama-server's flags, answer ``--help`` /
``--version`` / ``--list-devices`` and refuse a bad command line at once, then hand over to
``serving`` to run the server."""

from __future__ import annotations

import sys
from importlib.metadata import version

import mlx.core as mx

from mlxcel.engine.errors import MlxcelError
from mlxcel.server.cli.args import parse_args, usage
from mlxcel.server.runtime.config import ArgumentError
from mlxcel.server.runtime.speculation_settings import resolve
from mlxcel.server.tools.registry import ToolsSetupError
from mlxcel.server.tools.registry import check_flags as check_tool_flags


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        config = parse_args(argv)
    except ArgumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.help:
        print(usage())
        return 0
    if config.version:
        print(f"mlxcel-server {version('mlxcel')} (llama-server compatible)")
        return 0
    if config.list_devices:
        print(f"Available devices:\n  {mx.default_device()}")
        return 0
    try:
        resolve(config)  # a speculative setup that cannot work ends here, before anything loads
    except MlxcelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        check_tool_flags(config)  # --tools names and the MCP config, as upstream refuses them (status 1)
    except ToolsSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Only now the heavy part: mlx-lm (and transformers), FastAPI and uvicorn load here, so a
    # command line refused above, --help and --version answer without them.
    from mlxcel.server.cli.serving import run  # noqa: PLC0415 - defers mlx-lm, transformers, FastAPI

    return run(config)
