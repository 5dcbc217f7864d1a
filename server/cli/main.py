"""The console entry points: ``mlxcel {generate,serve}`` and ``mlxcel-server``.

Each one first checks the ``MLXCEL_*`` switches (``engine/platform/settings.py``), re-executes the
process with OpenBLAS preloaded on a Linux CPU (see ``engine/platform/device.py``), then imports the
command it runs. Bad input, a bad switch value included, ends in one ``error: ...`` line on stderr
and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.metadata import version

from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.platform.logging_setup import setup_logging_from_env
from mlxcel.engine.platform.settings import SettingsError, settings
from mlxcel.server.cli.parser import EXIT_USAGE, CliArgumentParser

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130

# This module stays free of MLX: the process re-executes itself with OpenBLAS preloaded before
# MLX is first imported, so the commands (and everything that imports mlx) load only after that.


def _prepare_process() -> bool:
    """Check the switches, then re-execute with OpenBLAS and set up logging; False (after the error
    line) when a switch holds a bad value: the process ends before MLX loads."""
    try:
        settings()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    from mlxcel.engine.platform.device import reexec_with_fast_blas  # noqa: PLC0415 - defers mlx

    reexec_with_fast_blas()
    setup_logging_from_env()
    return True


def run_command(command: Callable[[list[str]], int | None], argv: list[str]) -> int:
    """Run one subcommand, turning mlxcel's input errors into an ``error:`` line."""
    try:
        return int(command(argv) or 0)
    except MlxcelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `mlxcel generate ... | head`
        return 0


def _generate(argv: list[str]) -> int:
    from mlxcel.server.cli.generate import main  # noqa: PLC0415 - defers mlx

    return main(argv)


def _serve(argv: list[str]) -> int:
    try:
        from mlxcel.server.cli.serve import main  # noqa: PLC0415 - defers mlx
    except ModuleNotFoundError as exc:
        if exc.name != "mlxcel.server.cli.serve":
            raise
        print("error: `mlxcel serve` is not available in this installation", file=sys.stderr)
        return EXIT_ERROR
    return main(argv)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "generate": (_generate, "generate text from a prompt on the command line"),
    "serve": (_serve, "run the llama-server compatible HTTP server (same flags as mlxcel-server)"),
}


def _top_parser() -> CliArgumentParser:
    parser = CliArgumentParser(
        prog="mlxcel",
        description="MLX inference with exact speculative decoding; a drop-in llama-server replacement.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _top_parser().print_help()
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        print(f"mlxcel {version('mlxcel')}")
        return 0
    if argv[0] not in COMMANDS:
        _top_parser().error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
    if not _prepare_process():
        return EXIT_USAGE
    command, _ = COMMANDS[argv[0]]
    return run_command(command, argv[1:])


def server_main(argv: Sequence[str] | None = None) -> int:
    """``mlxcel-server``: the same as ``mlxcel serve``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not _prepare_process():
        return EXIT_USAGE
    return run_command(_serve, argv)


if __name__ == "__main__":
    sys.exit(main())
