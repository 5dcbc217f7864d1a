"""Where the upstream llama-server captures live: ``$MLXCEL_LLAMA_SERVER_CAPTURES``, else the
``shared/reference/llama-server`` folder beside the checkout (as developers and CI have it)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def captures_dir() -> Path:
    env = os.environ.get("MLXCEL_LLAMA_SERVER_CAPTURES")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "reference" / "llama-server", Path("/work/shared/reference/llama-server")]
    for c in candidates:
        if (c / "responses").is_dir():
            return c
    raise RuntimeError(
        "the llama-server captures were not found; set MLXCEL_LLAMA_SERVER_CAPTURES to the folder holding "
        "help.txt and responses/ (looked in: " + ", ".join(map(str, candidates)) + ")"
    )


CAPTURES = captures_dir()
