#!/usr/bin/env python
"""The CPU matmul kernel alone, per call, at 1..16 rows: process CPU time (robust to other jobs
on the machine, unlike wall time), one thread, weights streamed from memory (enough copies of
each matrix, used in turn, to overflow the last-level cache).

``--builds NAME=PATH,...`` compares builds of the extension (``_qmatmul*.so`` files, e.g. one
built from another commit's ``qmatmul_src``): ``--rounds`` rounds of child processes alternating
between the builds; each cell is the median over rounds of the median over calls.

    .venv/bin/python scripts/bench_qmatmul_kernel.py
    .venv/bin/python scripts/bench_qmatmul_kernel.py --builds base=/tmp/a.so,new=/tmp/b.so --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from extension_builds import add_build_arguments, parse_builds, use_build  # scripts/ is on the path

# (label, ggml type, n, k): SmolLM2's MLP and head, Qwen2.5-1.5B's MLP gate / up, attention and MLP down.
SHAPES = [("1536x576 Q4_1", 3, 1536, 576), ("49152x576 Q8_0 (head)", 8, 49152, 576),
          ("8960x1536 Q4_K", 12, 8960, 1536), ("1536x1536 Q6_K", 14, 1536, 1536),
          ("1536x8960 Q6_K", 14, 1536, 8960)]
ROWS = (1, 2, 4, 8, 16)
CACHE_BYTES = 96 << 20


def child(args) -> dict:
    if args.build:
        use_build(args.build)
    import mlx.core as mx
    import numpy as np
    from gguf import GGML_QUANT_SIZES

    from mlxcel.engine.platform import qmatmul

    qmatmul.set_threads(1)
    rng = np.random.default_rng(0)
    out = {}
    for label, qtype, n, k in SHAPES:
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
        half_at = {3: [0, 2], 8: [0], 12: [0, 2], 14: [size - 2]}[qtype]
        for at in half_at:
            raw[:, :, at:at + 2] = (rng.standard_normal((n, k // block)) * 0.02).astype(np.float16) \
                .view(np.uint8).reshape(n, k // block, 2)
        w0 = qmatmul.pack_gguf(raw.reshape(n, -1), qtype, n, k)
        copies = max(1, -(-CACHE_BYTES // w0.packed.nbytes))
        # each copy packed like a loaded model's matrix (aligned, huge pages), not an array copy of one
        ws = [w0] + [qmatmul.pack_gguf(raw.reshape(n, -1), qtype, n, k) for _ in range(copies - 1)]
        mx.eval([w.packed for w in ws])
        cell = {}
        for m in ROWS:
            x = mx.array(rng.standard_normal((m, k)).astype(np.float32))
            mx.eval(x)
            times = []
            calls = max(2 * len(ws), int(args.calls * 16 / m))
            for i in range(calls):
                t = time.process_time()
                mx.eval(qmatmul.qmatmul(x, ws[i % len(ws)]))
                times.append(time.process_time() - t)
            cell[str(m)] = statistics.median(times[len(ws):]) * 1e3
        out[label] = cell
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=60)
    add_build_arguments(ap, rounds=3)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    builds = [(name, path) for name, path, _ in parse_builds(args.builds)]
    load = os.getloadavg()[0]
    per: dict[str, list[dict]] = {}
    for _ in range(args.rounds if args.builds else 1):
        for name, path in builds:
            cmd = [sys.executable, __file__, "--child", "--calls", str(args.calls)] + (["--build", path] if path else [])
            env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            per.setdefault(name, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"process CPU ms per call, 1 thread, load average {load:.1f} -> {os.getloadavg()[0]:.1f}\n")
    print("| W (N x K), type | build | " + " | ".join(f"{m} row{'s' if m > 1 else ''}" for m in ROWS) + " |")
    print("|---|---|" + "---:|" * len(ROWS))
    for label, *_ in SHAPES:
        for name, rs in per.items():
            ms = {m: statistics.median(r[label][str(m)] for r in rs) for m in ROWS}
            cells = [f"{ms[1]:.3f} ms"] + [f"{ms[m]:.3f} ({ms[m] / ms[1]:.2f}x)" for m in ROWS[1:]]
            print(f"| {label} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
