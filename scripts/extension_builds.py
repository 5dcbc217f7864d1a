"""Comparing builds of the CPU kernels' extension in one benchmark run: the benchmark's parent runs
one child process per build (``--builds NAME=PATH[:VAR=VALUE...],...``, rounds alternating between
them), and each child imports its build's ``_qmatmul*.so`` in place of the installed one.

Shared by ``bench_qmatmul_kernel.py``, ``bench_forward_width.py``, ``bench_prefill.py`` and
``bench_decode_threads.py`` (``scripts/`` is on the path when a script runs)."""

from __future__ import annotations

import argparse
import sys


def use_build(path: str) -> None:
    """Import the extension from ``path`` in place of the installed one (before anything loads it)."""
    import importlib.util

    name = "mlxcel.engine.platform._qmatmul"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module


def parse_builds(spec: str) -> list[tuple[str, str, dict[str, str]]]:
    """``NAME=PATH[:VAR=VALUE...],...`` -> (name, extension path, environment) per build; the installed
    build alone when ``spec`` is empty."""
    if not spec:
        return [("installed", "", {})]
    builds = []
    for item in spec.split(","):
        name, rest = item.split("=", 1)
        path, *settings = rest.split(":")
        builds.append((name, path, dict(s.split("=", 1) for s in settings)))
    return builds


def add_build_arguments(ap: argparse.ArgumentParser, rounds: int) -> None:
    """``--builds`` and ``--rounds`` for the parent; the hidden ``--build`` / ``--child`` of a child."""
    ap.add_argument("--builds", default="", help="NAME=PATH[:VAR=VALUE...],... extension builds to compare")
    ap.add_argument("--rounds", type=int, default=rounds, help="child processes per build with --builds")
    ap.add_argument("--build", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
