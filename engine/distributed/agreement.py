"""The startup check that every rank loaded the same model with the same settings.

Each rank hashes a description of what it loaded (the model's config, the checkpoint's name and
size, the settings that shape the engine's steps) and the ranks compare hashes with one
collective. A rank that differs stops every rank with an error that names it, before any request
is served; a lockstep over different models would otherwise give wrong tokens or hang."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel.engine.distributed.collectives import gather_ints
from mlxcel.engine.distributed.world import DistributedError


def model_description(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """What identifies a loaded checkpoint: its config and its file(s)' names and sizes."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".gguf"))
    return {"config": config, "files": [(p.name, p.stat().st_size) for p in files]}


def digest(description: Any) -> list[int]:
    """Two int32 words of a SHA-256 of ``description`` (JSON, sorted keys)."""
    text = json.dumps(description, sort_keys=True, default=str).encode()
    raw = hashlib.sha256(text).digest()
    return [int.from_bytes(raw[i:i + 4], "little") & 0x7FFFFFFF for i in (0, 4)]


def check_same(group: mx.distributed.Group, description: Any, what: str = "model and settings") -> None:
    """Raise ``DistributedError`` on every rank unless every rank's ``description`` is rank 0's."""
    words = gather_ints(group, digest(description))
    differ = [r for r, w in enumerate(words) if w != words[0]]
    if differ:
        ranks = ", ".join(str(r) for r in differ)
        raise DistributedError(f"rank{'s' if len(differ) > 1 else ''} {ranks} loaded a different {what} than "
                               "rank 0; every rank must be started with the same model file and flags")
