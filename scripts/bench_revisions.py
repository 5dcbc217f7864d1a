#!/usr/bin/env python
"""Run one benchmark script on two revisions of the tree, interleaved, in one run.

A refactor must leave speed alone; this measures that instead of believing it. ``--base REV`` is
checked out into a temporary git worktree, importable as ``mlxcel`` through a small package of
links put first on ``PYTHONPATH`` (the editable install keeps serving the working tree otherwise).
Then the script runs ``--rounds`` times on each side, alternating base, work, base, work, so
background load hits both alike, and every line of its output is printed under the side that
produced it. The script's own ratios (against mlx-lm, in the same process or run) are the figures
to compare: they cancel most machine drift.

    ./scripts/with-blas .venv/bin/python scripts/bench_revisions.py --base HEAD~3 --rounds 2 \\
        -- scripts/bench_generate.py --runs 3

The script path is taken from each side's own tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "drafters", "server")


def worktree(rev: str, where: Path) -> Path:
    tree = where / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(tree), rev], check=True,
                   capture_output=True)
    pkg = where / "pkg" / "mlxcel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name in PACKAGES:
        (pkg / name).symlink_to(tree / name)
    return tree


def run(side: str, tree: Path, pythonpath: str | None, script: list[str]) -> None:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, str(tree / script[0]), *script[1:]], cwd=tree, env=env, capture_output=True,
                       text=True)
    print(f"===== {side} (exit {r.returncode})", flush=True)
    print(r.stdout.rstrip(), flush=True)
    if r.returncode != 0:
        print(r.stderr[-4000:], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the revision to compare the working tree against")
    ap.add_argument("--rounds", type=int, default=2, help="runs per side, interleaved")
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...], relative to the tree")
    args = ap.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        ap.error("give the benchmark script after --")
    with tempfile.TemporaryDirectory(prefix="mlxcel-revisions-") as tmp:
        base = worktree(args.base, Path(tmp))
        try:
            for i in range(args.rounds):
                run(f"base {args.base} #{i + 1}", base, str(Path(tmp) / "pkg"), script)
                run(f"work tree #{i + 1}", REPO, None, script)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)


if __name__ == "__main__":
    main()
