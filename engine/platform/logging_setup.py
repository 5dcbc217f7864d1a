"""Opt-in diagnostic logging for the command-line tools.

By default the CLI installs no handler, so stdout carries only generated text and stderr only
errors (Python's last-resort handler still shows warnings). ``MLXCEL_LOG=info`` or
``MLXCEL_LOG=debug`` attaches a stderr handler to the ``mlxcel`` logger, keeping piped stdout
clean.
"""

from __future__ import annotations

import logging
import sys

from mlxcel.engine.platform.settings import settings

LOGGER_NAME = "mlxcel"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging_from_env() -> int | None:
    """Install a stderr handler at the level ``MLXCEL_LOG`` names; returns that level, or None
    when the variable is unset (then nothing is installed; ``settings`` refuses an unknown level)."""
    name = settings().log
    if name is None:
        return None
    level = LEVELS[name]
    logger = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_mlxcel", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._mlxcel = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
    return level
