#!/usr/bin/env python3
"""Stands in for the ``llama-server`` binary under upstream's server tests (``LLAMA_SERVER_BIN_PATH``).

Every flag passes through unchanged except where a model comes from: the tests name hub models
(``--hf-repo``, ``--hf-file``, ``--model-url``, ``--hf-repo-draft``, or a ``-m`` / ``-md`` path that
was to be downloaded), and nothing can be downloaded here, so each of those becomes
``-m`` / ``-md`` with the local GGUF in ``MLXCEL_CONFORMANCE_MODEL``. Then it becomes the server
that ``MLXCEL_CONFORMANCE_TARGET`` names: ``mlxcel`` (``python -m mlxcel.server.cli`` with
``MLXCEL_CONFORMANCE_PYTHON``) or ``llama-server`` (the binary in
``MLXCEL_CONFORMANCE_LLAMA_SERVER``), so both run the very same command lines.

Standard library only: it runs under whatever Python the upstream tests use.
"""

from __future__ import annotations

import os
import sys

# flags whose value names a model source: (names, replaced by)
MODEL_SOURCES = {
    "--hf-repo": "-m", "-hf": "-m", "-hfr": "-m", "--model-url": "-m", "-mu": "-m",
    "--hf-repo-draft": "-md", "-hfd": "-md", "-hfrd": "-md", "--spec-draft-hf": "-md",
}
DROPPED = {"--hf-file", "-hff", "--hf-file-draft", "-hffd"}  # the file inside a hub repo
PATHS = {"--model": "-m", "-m": "-m", "--model-draft": "-md", "-md": "-md", "--spec-draft-model": "-md"}


def rewrite(argv: list[str], model: str) -> list[str]:
    out: list[str] = []
    chosen: dict[str, str] = {}  # "-m" / "-md" -> path
    i = 0
    while i < len(argv):
        arg, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        name, eq, inline = arg.partition("=")
        if eq:
            value = inline
        step = 1 if eq else 2
        if name in MODEL_SOURCES and value is not None:
            chosen.setdefault(MODEL_SOURCES[name], model)
            i += step
        elif name in DROPPED and value is not None:
            i += step
        elif name in PATHS and value is not None:
            chosen[PATHS[name]] = value if os.path.exists(value) else model
            i += step
        else:
            out.append(arg)
            i += 1
    for flag, path in chosen.items():
        out += [flag, path]
    return out


def router_preset(argv: list[str]) -> list[str]:
    """A server started with no model is a router: it gets the preset of the hub models the tests
    would have in their cache (``plugin.py``), unless it names a preset of its own."""
    names = {a.partition("=")[0] for a in argv}
    preset = os.environ.get("MLXCEL_CONFORMANCE_ROUTER_PRESET")
    if preset and not names & {*MODEL_SOURCES, *PATHS, "--models-preset"}:
        return ["--models-preset", preset]
    return []


def main() -> None:
    model = os.environ["MLXCEL_CONFORMANCE_MODEL"]
    args = rewrite(sys.argv[1:], model) + router_preset(sys.argv[1:])
    target = os.environ.get("MLXCEL_CONFORMANCE_TARGET", "mlxcel")
    if target == "llama-server":
        binary = os.environ["MLXCEL_CONFORMANCE_LLAMA_SERVER"]
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXCEL_BLAS_PRELOADED")}
        os.execve(binary, [binary, *args], env)  # the BLAS preloads are MLX's, not llama.cpp's
    python = os.environ.get("MLXCEL_CONFORMANCE_PYTHON", sys.executable)
    os.execv(python, [python, "-m", "mlxcel.server.cli", *args])


if __name__ == "__main__":
    main()
