"""Opt-in diagnostic logging for the command-line tools.

By default the CLI installs no handler, so stdout carries only generated text and stderr only
errors (Python's last-resort handler still shows warnings). ``MLXCEL_LOG=info`` or
``MLXCEL_LOG=debug`` attaches a stderr handler to the ``mlxcel`` logger, keeping piped stdout
clean.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "mlxcel"
ENV_VAR = "MLXCEL_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
          "error": logging.ERROR}


def setup_logging_from_env() -> int | None:
    """Install a stderr handler at the level ``MLXCEL_LOG`` names; returns that level, or None
    when the variable is unset or unrecognised (then nothing is installed)."""
    level = LEVELS.get(os.environ.get(ENV_VAR, "").strip().lower())
    if level is None:
        return None
    logger = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_mlxcel", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._mlxcel = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
    return level
