#!/usr/bin/env python
"""Summarize a server's step trace (``MLXCEL_TRACE_STEPS=PATH``, ``server/runtime/step_trace.py``).

Per kind of step (``step``: an ordinary ragged step, waited for; ``step-ahead``: one that left its
tokens unread; ``ahead``: a pipelined step) and in total: how many, their share of the traced wall
time, mean rows / tokens / drafts per step, the forward's share where it was timed, and the gaps
between steps (what the engine did besides stepping: taking requests in, prefill outside the batch,
idling). Steps more than ``--idle`` seconds apart start a new busy period; those gaps count as idle.

    .venv/bin/python scripts/trace_steps.py TRACE.jsonl [--idle 0.25]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="+")
    ap.add_argument("--idle", type=float, default=0.25, help="a gap longer than this (s) is idle, not overhead")
    args = ap.parse_args()
    for path in args.trace:
        with open(path) as f:
            steps = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["t0"])
        if not steps:
            print(f"{path}: empty")
            continue
        kinds: dict[str, list[dict]] = defaultdict(list)
        for r in steps:
            kinds[r["kind"]].append(r)
        busy = gaps = 0.0
        idle = 0
        for prev, r in zip(steps, steps[1:]):
            gap = r["t0"] - prev["t_end"]
            if gap > args.idle:
                idle += 1
            else:
                gaps += max(0.0, gap)
        busy = sum(r["t_end"] - r["t0"] for r in steps)
        wall = busy + gaps
        tokens = sum(r["tokens"] for r in steps)
        print(f"{path}: {len(steps)} steps, busy {busy:.2f} s + gaps {gaps:.2f} s between steps "
              f"({100 * gaps / max(wall, 1e-9):.0f}%), {idle} idle periods; {tokens} tokens forwarded")
        print("| kind | steps | share of busy+gaps | ms/step | rows | tokens | drafts | accepted | verify rows "
              "| quiet rows | prefill rows | forward ms |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for kind, rs in sorted(kinds.items()):
            n = len(rs)
            t = sum(r["t_end"] - r["t0"] for r in rs)
            fw = [r["forward_ms"] for r in rs if r.get("forward_ms") is not None]

            def mean(key, rs=rs, n=n):
                return sum(r.get(key, 0) for r in rs) / n
            print(f"| {kind} | {n} | {100 * t / max(wall, 1e-9):.0f}% | {1e3 * t / n:.1f} | {mean('rows'):.1f} "
                  f"| {mean('tokens'):.1f} | {mean('drafts'):.1f} | {mean('accepted'):.1f} | {mean('verify_rows'):.1f} "
                  f"| {mean('quiet_rows'):.1f} | {mean('prefill_rows'):.1f} "
                  f"| {sum(fw) / len(fw):.1f} |" if fw else f"| {kind} | {n} | {100 * t / max(wall, 1e-9):.0f}% "
                  f"| {1e3 * t / n:.1f} | {mean('rows'):.1f} | {mean('tokens'):.1f} | {mean('drafts'):.1f} "
                  f"| {mean('accepted'):.1f} | {mean('verify_rows'):.1f} | {mean('quiet_rows'):.1f} "
                  f"| {mean('prefill_rows'):.1f} | |")
        # where a wide step's time goes: by tokens in the forward
        by_width: dict[int, list[float]] = defaultdict(list)
        for r in kinds.get("step", []):
            if r.get("forward_ms") is not None:
                by_width[min(64, 1 << max(0, (r["tokens"] - 1).bit_length()))].append(r["forward_ms"])
        if by_width:
            print("forward ms by tokens in the step (<= N): "
                  + ", ".join(f"{w}: {sum(v) / len(v):.1f} ({len(v)})" for w, v in sorted(by_width.items())))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
