"""The layer contract (``make lint``) holds on the tree, and fails when an upward or circular
import is added: run on a copy of the packages with one import planted, it must report it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (make setup-test)")


def lint_copy(tmp_path: Path, plant: tuple[str, str] | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` over a copy of engine/, drafters/ and server/ importable as ``mlxcel``,
    with ``plant = (file, import line)`` appended to one file first."""
    pkg = tmp_path / "pkg" / "mlxcel"
    for name in ("engine", "drafters", "server"):
        shutil.copytree(REPO / name, pkg / name, ignore=shutil.ignore_patterns("__pycache__"))
    if plant is not None:
        path = pkg / plant[0]
        path.write_text(path.read_text() + "\n" + plant[1] + "\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg")}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(REPO / "pyproject.toml")], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_tree_keeps_every_contract(tmp_path):
    r = lint_copy(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("plant, broken", [
    (("engine/decode/plain.py", "import mlxcel.server.http.app  # upward: engine -> server"), "layers point down"),
    (("server/runtime/scheduler.py", "from mlxcel.server.cli import args  # upward: runtime -> cli"),
     "layers point down"),
    (("engine/sampling/chain.py", "from mlxcel.engine.speculative import verify  # circular inside the engine"),
     "inside the engine"),
    (("drafters/mtp/head.py", "from mlxcel.drafters.dflash import network  # one kind reaching into another"),
     "drafter kinds are independent"),
    (("server/runtime/task.py", "from mlxcel.server.runtime import scheduler  # a cycle inside one layer"),
     "no import cycles"),
    (("server/http/plan.py", "from mlxcel.server.http.api.native import format  # plan reaching up to an API"),
     "inside the HTTP layer"),
    (("server/http/api/anthropic/format.py", "from mlxcel.server.http.api.responses import request  # API to API"),
     "API packages are independent"),
    (("server/http/gate/middleware.py", "from mlxcel.server.http.api.webui import cors_proxy  # shared to an API"),
     "only the app and the router import an API package"),
])
def test_an_upward_or_circular_import_breaks_the_contract(tmp_path, plant, broken):
    r = lint_copy(tmp_path, plant)
    assert r.returncode != 0, r.stdout
    assert broken in r.stdout and "BROKEN" in r.stdout
