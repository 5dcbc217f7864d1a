#!/usr/bin/env python
"""What a forward over k tokens costs relative to one token (verify rounds and batched decode
live on this), for the CPU kernels and the float32 path, in one run.

Each arm is a child process (the weight policy is fixed at load): ``packed`` (the default on a CPU
with the kernels: quantized weights run packed, norms/rope/attention fused) and ``f32``
(``MLXCEL_WEIGHTS=float32``). In each, one forward over k new tokens (full logits, as a verify
round scores) on a warm cache of ``--context`` tokens, widths interleaved round by round, median
of ``--reps``; kernel and OpenBLAS threads ``--threads``.

``--builds NAME=PATH,...`` compares builds of the extension instead (each a ``_qmatmul*.so``, e.g.
one built from another commit's ``qmatmul_src``): one ``packed`` arm per build, ``--rounds``
rounds of child processes alternating between the builds, so that load drifts hit every arm alike.
A build may carry environment settings for its child, ``NAME=PATH:VAR=VALUE:...`` (e.g.
``layers=/tmp/a.so:MLXCEL_FUSED_LAYER=0``), so that switches are compared the same way.

    ./scripts/with-blas .venv/bin/python scripts/bench_forward_width.py [-m GGUF] [--threads 1]
    ./scripts/with-blas .venv/bin/python scripts/bench_forward_width.py --builds base=/tmp/a.so,new=/tmp/b.so
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

WIDTHS = (1, 2, 4, 8, 16)


def child(args) -> dict:
    if args.build:
        use_build(args.build)
    import mlx.core as mx

    from mlxcel.engine.cache.kv_cache import rewind
    from mlxcel.engine.cache.prefill import prefill
    from mlxcel.engine.model.loading import load_model
    from mlxcel.engine.platform import qmatmul

    lm = load_model(args.model)
    qmatmul.set_threads(args.threads)
    if not hasattr(qmatmul.extension(), "swiglu"):  # a build from before the fused SwiGLU
        from mlxcel.engine.platform import fused_layers

        for (module, attr), fn in list(fused_layers._originals.items()):
            if attr == "swiglu":
                setattr(sys.modules[module], attr, fn)
    text = "The history of computing is a story of abstraction layered on abstraction. " * 20
    prompt = list(lm.tokenizer.encode(text))[: args.context + max(WIDTHS)]
    cache = lm.make_cache()
    mx.eval(prefill(lm.model, prompt[: args.context], cache))
    block = prompt[args.context:]

    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def once(w: int) -> float:
        t = clock()
        mx.eval(lm.model(mx.array(block[:w])[None], cache=cache))
        dt = clock() - t
        rewind(cache, w)
        return dt

    for w in WIDTHS:
        once(w)
    times = {w: [] for w in WIDTHS}
    for _ in range(args.reps):
        for w in WIDTHS:
            times[w].append(once(w))
    ms = {w: statistics.median(v) * 1e3 for w, v in times.items()}
    return {"ms": ms, "ratio": {w: ms[w] / ms[1] for w in WIDTHS}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: the built-in SmolLM2 Q4_1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--arms", default="packed,f32")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the process's CPU time (all its threads), robust to other jobs on the cores")
    add_build_arguments(ap, rounds=3)  # the builds run the packed arm
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    from mlxcel.engine.platform.device import env_with_fast_blas

    load = os.getloadavg()[0]
    runs = [(arm, arm, "", {}) for arm in args.arms.split(",")]
    if args.builds:
        builds = parse_builds(args.builds)
        runs = [(name, "packed", path, extra) for _ in range(args.rounds) for name, path, extra in builds]
    per_arm: dict[str, list[dict]] = {}
    for name, arm, build, extra in runs:
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXCEL_BLAS_PRELOADED")}
        env.update(extra)
        env["OPENBLAS_NUM_THREADS"] = str(args.threads)
        if arm == "f32":
            env["MLXCEL_WEIGHTS"] = "float32"
        cmd = [sys.executable, __file__, "--child", "--threads", str(args.threads), "--context", str(args.context),
               "--reps", str(args.reps), "--clock", args.clock] + (["-m", args.model] if args.model else []) + \
            (["--build", build] if build else [])
        out = subprocess.run(cmd, env=env_with_fast_blas(env), capture_output=True, text=True, check=True)
        per_arm.setdefault(name, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    results = {}
    for name, rs in per_arm.items():  # the median over rounds of each width's median
        ms = {str(w): statistics.median(r["ms"][str(w)] for r in rs) for w in WIDTHS}
        results[name] = {"ms": ms, "ratio": {w: ms[w] / ms["1"] for w in ms}}
    print(json.dumps({"model": args.model or "SmolLM2-135M Q4_1", "threads": args.threads, "load_avg_start": load,
                      "load_avg_end": os.getloadavg()[0], "results": results}))
    print(f"\n{args.model or 'SmolLM2-135M Q4_1'}, {args.threads} thread(s), context {args.context}, {args.clock} time, "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}\n")
    print("| arm | " + " | ".join(f"k={w} ms (x k=1)" for w in WIDTHS) + " |")
    print("|---|" + "---:|" * len(WIDTHS))
    for arm, r in results.items():
        cells = [f"{r['ms'][str(w)]:.1f} ({r['ratio'][str(w)]:.2f}x)" for w in WIDTHS]
        print(f"| {arm} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
