"""Pipelined greedy decode (``async_eval`` of step n+1 while step n runs, as ``generate_tokens``
does) at 1 and 2 kernel threads, for one or more builds of the extension, in one run.

Each arm (build x threads) is a child process; rounds alternate the arms so that load drifts hit
every arm alike; a build named ``NAME@T`` runs at T threads only. Per arm: decode tok/s (wall) and the process's CPU ms per token (all threads),
the median over rounds. A build may carry environment switches (``NAME=PATH:VAR=VALUE``).

    OPENBLAS_NUM_THREADS=1 ./scripts/with-blas .venv/bin/python scripts/bench_decode_threads.py \
        --threads 1,2 --rounds 3 --builds base=/tmp/a.so,new=/tmp/b.so [-m model.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from extension_builds import parse_builds, use_build  # (scripts/ is on the path when a script runs)


def child(args) -> dict:
    if args.build:
        use_build(args.build)
    import mlx.core as mx

    from mlxcel.engine.cache.prefill import prefill
    from mlxcel.engine.model.loading import load_model
    from mlxcel.engine.platform import qmatmul

    lm = load_model(args.model)
    qmatmul.set_threads(args.threads)
    prompt = list(lm.tokenizer.encode("The history of computing is a story of abstraction. " * 4))
    cache = lm.make_cache()
    logits = prefill(lm.model, prompt, cache)
    y = mx.argmax(logits.reshape(-1, logits.shape[-1])[-1:], axis=-1)
    mx.eval(y)

    def step(y):
        out = lm.model(y[:, None], cache=cache)
        return mx.argmax(out[:, -1, :], axis=-1)

    nxt = step(y)
    mx.async_eval(nxt)
    for _ in range(8):  # warm-up
        cur, nxt = nxt, step(nxt)
        mx.async_eval(nxt)
        cur.item()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.tokens):
        cur, nxt = nxt, step(nxt)
        mx.async_eval(nxt)
        cur.item()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    nxt.item()
    return {"tok_s": args.tokens / wall, "cpu_ms": cpu / args.tokens * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: the built-in SmolLM2 Q4_1)")
    ap.add_argument("--threads", default="1,2", help="kernel thread counts, comma-separated")
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--builds", default="", help="NAME=PATH[:VAR=VALUE...],... (default: the installed build)")
    ap.add_argument("--build", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = int(args.threads)
        print(json.dumps(child(args)))
        return
    from mlxcel.engine.platform.device import env_with_fast_blas

    builds = [("installed", "", {})]
    if args.builds:
        builds = parse_builds(args.builds)
    threads = [int(t) for t in args.threads.split(",")]
    load = os.getloadavg()[0]
    per_arm: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for t in threads:
            for name, path, extra in builds:
                if "@" in name and int(name.split("@")[1]) != t:
                    continue
                env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXCEL_BLAS_PRELOADED")}
                env.update(extra)
                env["OPENBLAS_NUM_THREADS"] = "1"
                cmd = [sys.executable, __file__, "--child", "--threads", str(t), "--tokens", str(args.tokens)] + \
                    (["-m", args.model] if args.model else []) + (["--build", path] if path else [])
                out = subprocess.run(cmd, env=env_with_fast_blas(env), capture_output=True, text=True, check=True)
                per_arm.setdefault(name if "@" in name else f"{name} t={t}", []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    end = os.getloadavg()[0]
    print(f"\n{args.model or 'SmolLM2-135M Q4_1'}, {args.tokens} tokens, {args.rounds} rounds, "
          f"load average {load:.1f} -> {end:.1f}\n")
    print("| arm | tok/s (median) | tok/s (each round) | CPU ms/token |")
    print("|---|---:|---|---:|")
    for arm, rs in per_arm.items():
        each = ", ".join(f"{r['tok_s']:.1f}" for r in rs)
        print(f"| {arm} | {statistics.median(r['tok_s'] for r in rs):.1f} | {each} | "
              f"{statistics.median(r['cpu_ms'] for r in rs):.2f} |")


if __name__ == "__main__":
    main()
