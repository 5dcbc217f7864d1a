"""The argument parser every ``mlxcel`` command uses."""

from __future__ import annotations

import argparse
import sys

EXIT_USAGE = 2


class CliArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``error:`` line pointing at ``--help``."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_USAGE)
