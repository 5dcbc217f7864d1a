"""Reading a checkpoint directory's ``config.json`` with a clear load error (target, MTP and
DFlash-family checkpoints share it; each names what a missing file means for its kind)."""

from __future__ import annotations

import json
from pathlib import Path

from mlxcel.engine.errors import ModelLoadError


def read_config_json(path: Path, missing: str) -> dict:
    """``path/config.json`` parsed; ``ModelLoadError(missing)`` when there is none, and a clear
    error when it cannot be read or is not JSON."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(missing)
    try:
        return json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}") from exc
