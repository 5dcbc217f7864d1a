#!/usr/bin/env python
"""Prefill speed: ``engine.cache.prefill.prefill`` over the first n tokens of a prompt into a fresh
cache, tokens per second (process CPU time by default), best of ``--reps``, for n in ``--lengths``.

``--builds NAME=PATH,...`` compares builds of the extension (``_qmatmul*.so`` files): ``--rounds``
rounds of child processes alternating between the builds; each cell is the best over rounds.

    ./scripts/with-blas .venv/bin/python scripts/bench_prefill.py [-m GGUF] [--threads 1]
    ./scripts/with-blas .venv/bin/python scripts/bench_prefill.py --builds base=/tmp/a.so,new=/tmp/b.so
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from extension_builds import add_build_arguments, parse_builds, use_build  # scripts/ is on the path


def child(args) -> dict:
    if args.build:
        use_build(args.build)
    import mlx.core as mx

    from mlxcel.engine.cache.prefill import prefill
    from mlxcel.engine.model.loading import load_model
    from mlxcel.engine.platform import qmatmul

    lm = load_model(args.model)
    qmatmul.set_threads(args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]
    text = "The history of computing is a story of abstraction layered on abstraction. " * 80
    tokens = list(lm.tokenizer.encode(text))
    if len(tokens) < max(lengths):
        raise SystemExit(f"the prompt has only {len(tokens)} tokens")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    mx.eval(prefill(lm.model, tokens[:16], lm.make_cache()))  # warm-up
    out = {}
    for n in lengths:
        best = float("inf")
        for _ in range(args.reps):
            cache = lm.make_cache()
            t = clock()
            mx.eval(prefill(lm.model, tokens[:n], cache))
            best = min(best, clock() - t)
        out[str(n)] = n / best
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: the built-in SmolLM2 Q4_1)")
    ap.add_argument("--lengths", default="64,256,512")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    add_build_arguments(ap, rounds=2)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    builds = [(name, path) for name, path, _ in parse_builds(args.builds)]
    load = os.getloadavg()[0]
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds if args.builds else 1):
        for name, path in builds:
            cmd = [sys.executable, __file__, "--child", "--lengths", args.lengths, "--reps", str(args.reps),
                   "--threads", str(args.threads), "--clock", args.clock] + (["--build", path] if path else []) + \
                  (["-m", args.model] if args.model else [])
            env = {**os.environ, "OPENBLAS_NUM_THREADS": str(args.threads)}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got = json.loads(done.stdout.strip().splitlines()[-1])
            cell = best.setdefault(name, {})
            for n, v in got.items():
                cell[n] = max(cell.get(n, 0.0), v)
    lengths = args.lengths.split(",")
    print(f"{args.model or 'SmolLM2-135M Q4_1'}, {args.threads} thread(s), prefill tokens/s ({args.clock} time, "
          f"best of {args.reps} x {args.rounds if args.builds else 1}), load average {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| build | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for name, cell in best.items():
        print(f"| {name} | " + " | ".join(f"{cell[n]:.0f}" for n in lengths) + " |")


if __name__ == "__main__":
    main()
