#!/usr/bin/env python
"""The conformance table: upstream's server tests against mlxcel-server and against the real
llama-server, on the same model and command lines, from the two files ``run.py`` writes under
``compat/llama-server/<build>/``. Prints the markdown table that ``docs/llama-server-compat.md``
carries, per test file: the tests that pass against llama-server, how many of those pass against
mlxcel-server, and mlxcel's own passed / failed / skipped counts, with the totals over the files in
scope (``scope.py`` names the files and single tests that are not, and why) and over all; then every in-scope test that
passes against llama-server and fails against mlxcel-server, with mlxcel's failure message.

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
from scope import OUT_OF_SCOPE, reason  # noqa: E402


def load(target: str) -> dict[str, dict]:
    path = results_path(target)
    if not path.exists():
        raise SystemExit(f"{path} is missing: run scripts/conformance/run.py --target {target}")
    return json.loads(path.read_text())["tests"]


def table(ours: dict[str, dict], theirs: dict[str, dict]) -> tuple[str, list[str]]:
    by_file: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    total: dict[str, int] = defaultdict(int)
    regressions = []
    for test, result in sorted(ours.items()):
        in_scope = reason(test) is None
        counts = [by_file[test.split("::")[0]], total]
        keys = [result["outcome"]]
        if theirs.get(test, {}).get("outcome") == "passed":
            keys.append("baseline")
            if result["outcome"] == "passed":
                keys.append("both")
            elif in_scope:
                regressions.append(f"- `{test}`: {result['outcome']} ({result['message'][:160]})")
        for key in keys:
            for row in counts:
                row[key] += 1
                if in_scope:
                    row["in_" + key] += 1
        if not in_scope:
            by_file[test.split("::")[0]]["out"] += 1
    lines = ["| file | pass on llama-server | of those, pass on mlxcel | mlxcel passed | failed | skipped | scope |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name in sorted(by_file):
        row = by_file[name]
        scope = OUT_OF_SCOPE.get(name) or (f"in scope, but {row['out']} tests (see scope.py)" if row["out"]
                                          else "in scope")
        lines.append(f"| `{name}` | {row['baseline']} | {row['both']} | {row['passed']} | {row['failed']} | "
                     f"{row['skipped']} | {scope} |")
    for label, pre in (("in scope", "in_"), ("all", "")):
        share = 100.0 * total[pre + "both"] / total[pre + "baseline"] if total[pre + "baseline"] else 0.0
        lines.append(f"| **{label}** | **{total[pre + 'baseline']}** | **{total[pre + 'both']} ({share:.1f}%)** | "
                     f"{total[pre + 'passed']} | {total[pre + 'failed']} | {total[pre + 'skipped']} | |")
    return "\n".join(lines), regressions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--failures", action="store_true", help="also list what passes upstream and fails here")
    args = ap.parse_args()
    text, regressions = table(load("mlxcel"), load("llama-server"))
    print(text)
    if args.failures:
        print(f"\n{len(regressions)} in-scope tests pass against llama-server and not against mlxcel-server:")
        print("\n".join(regressions))


if __name__ == "__main__":
    main()
