#!/usr/bin/env python
"""The float32 matmul kernel (packed type F32, ``qmatmul_src/fkernel*.cpp``) against MLX's own
float32 matmul (OpenBLAS sgemm, and the one-row sgemv shim when preloaded) per call at 1..16 rows
and wider (the prefill crossover): process CPU time, one thread, weights streamed from memory
(enough copies of each matrix, used in turn, to overflow the last-level cache). The two arms
alternate call by call, so both see the same load. Run under ``scripts/with-blas``:

    OPENBLAS_NUM_THREADS=1 ./scripts/with-blas .venv/bin/python scripts/bench_float_kernel.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import mlx.core as mx
import numpy as np

from mlxcel.engine.platform import qmatmul

# SmolLM2-135M's projections: q/o, k/v, gate/up, down, the (tied) head.
SHAPES = [("576x576 (q, o)", 576, 576), ("192x576 (k, v)", 192, 576), ("1536x576 (gate, up)", 1536, 576),
          ("576x1536 (down)", 576, 1536), ("49152x576 (head)", 49152, 576)]
CACHE_BYTES = 96 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--shapes", default="", help="indices into SHAPES, comma-separated (default all)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    qmatmul.set_threads(1)
    ext = qmatmul.extension()
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0]
    print(f"process CPU ms per call (GB/s of weights), 1 thread, ISA {ext.isa()}, load average {load:.1f}\n")
    print("| W (N x K) | arm | " + " | ".join(f"{m} row{'s' if m > 1 else ''}" for m in rows) + " |")
    print("|---|---|" + "---:|" * len(rows))
    for label, n, k in shapes:
        copies = max(1, -(-CACHE_BYTES // (n * k * 4)))
        dense = [mx.array((rng.standard_normal((n, k)) * 0.02).astype(np.float32)) for _ in range(copies)]
        packed = [ext.repack_float(w, n, k) for w in dense]
        mx.eval(dense, packed)
        cells = {"kernel": [], "sgemm": []}
        for m in rows:
            x = mx.array(rng.standard_normal((m, k)).astype(np.float32))
            mx.eval(x)
            times = {"kernel": [], "sgemm": []}
            calls = max(2 * copies, int(args.calls * 16 / m))
            for i in range(calls):
                j = i % copies
                t = time.process_time()
                mx.eval(ext.qmatmul(x, packed[j], qmatmul.F32, 0, n, k))
                times["kernel"].append(time.process_time() - t)
                t = time.process_time()
                mx.eval(x @ dense[j].T)
                times["sgemm"].append(time.process_time() - t)
            for arm, ts in times.items():
                ms = statistics.median(ts[copies:]) * 1e3
                cells[arm].append(f"{ms:.3f} ({n * k * 4 / ms / 1e6:.1f})")
        for arm, c in cells.items():
            print(f"| {label} | {arm} | " + " | ".join(c) + " |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
