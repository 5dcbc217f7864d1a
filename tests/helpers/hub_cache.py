"""A local folder laid out as huggingface_hub's cache (``models--org--name/`` with ``refs/main``,
``snapshots/<commit>/`` whose files link into ``blobs/``), so ``-hf`` resolves without a network."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_repo(cache: Path, repo: str, files: dict[str, Path | bytes], commit: str = COMMIT) -> Path:
    """Put ``files`` (repository path -> a file to copy, or its bytes) into ``cache`` as a downloaded
    snapshot of ``repo`` at ``commit``, ``refs/main`` pointing to it; the snapshot folder."""
    base = cache / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    snapshot = base / "snapshots" / commit
    for name, source in files.items():
        data = source if isinstance(source, bytes) else source.read_bytes()
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def gguf_repo(cache: Path, repo: str, real: dict[str, Path], dummies: tuple[str, ...] = ()) -> Path:
    """A GGUF repository: ``real`` files (name -> a GGUF to copy) and ``dummies`` (names whose
    content only has to be distinct: resolution reads names, never bytes)."""
    files: dict[str, Path | bytes] = dict(real)
    files.update({name: f"GGUF placeholder {name}".encode() for name in dummies})
    return add_repo(cache, repo, files)
