#!/usr/bin/env python
"""The conformance table: upstream's server tests against mlxcel-server and against the real
llama-server, on the same model and command lines, from the two files ``run.py`` writes under
``compat/llama-server/<build>/``. Prints the markdown table that ``docs/llama-server-compat.md``
carries, per test file: the tests that pass against llama-server, how many of those pass against
mlxcel-server, and mlxcel's own passed / failed / skipped counts; then every test that passes
against llama-server and fails against mlxcel-server, with mlxcel's failure message.

    .venv/bin/python scripts/conformance/report.py            # the table
    .venv/bin/python scripts/conformance/report.py --failures # and the list
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import results_path  # noqa: E402


def load(target: str) -> dict[str, dict]:
    path = results_path(target)
    if not path.exists():
        raise SystemExit(f"{path} is missing: run scripts/conformance/run.py --target {target}")
    return json.loads(path.read_text())["tests"]


def table(ours: dict[str, dict], theirs: dict[str, dict]) -> tuple[str, list[str]]:
    by_file: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    regressions = []
    for test, result in ours.items():
        row = by_file[test.split("::")[0]]
        row[result["outcome"]] += 1
        if theirs.get(test, {}).get("outcome") == "passed":
            row["baseline"] += 1
            if result["outcome"] == "passed":
                row["both"] += 1
            else:
                regressions.append(f"- `{test}`: {result['outcome']} ({result['message'][:160]})")
    lines = ["| file | pass on llama-server | of those, pass on mlxcel | mlxcel passed | failed | skipped |",
             "|---|---:|---:|---:|---:|---:|"]
    total: dict[str, int] = defaultdict(int)
    for name in sorted(by_file):
        row = by_file[name]
        for key in ("baseline", "both", "passed", "failed", "skipped"):
            total[key] += row[key]
        lines.append(f"| `{name}` | {row['baseline']} | {row['both']} | {row['passed']} | {row['failed']} | "
                     f"{row['skipped']} |")
    share = 100.0 * total["both"] / total["baseline"] if total["baseline"] else 0.0
    lines.append(f"| **all** | **{total['baseline']}** | **{total['both']} ({share:.1f}%)** | {total['passed']} | "
                 f"{total['failed']} | {total['skipped']} |")
    return "\n".join(lines), regressions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--failures", action="store_true", help="also list what passes upstream and fails here")
    args = ap.parse_args()
    text, regressions = table(load("mlxcel"), load("llama-server"))
    print(text)
    if args.failures:
        print(f"\n{len(regressions)} tests pass against llama-server and not against mlxcel-server:")
        print("\n".join(regressions))


if __name__ == "__main__":
    main()
