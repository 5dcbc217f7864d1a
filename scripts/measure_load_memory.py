"""Resident memory of a GGUF loaded by mlxcel, per device profile: after the imports, after the
load, and after a short greedy generation (docs/benchmarks.md, "Memory").

Each profile runs in a fresh process, so no profile sees another's heap:

- ``native``: the MLX-native path Metal and CUDA run (``MLXCEL_WEIGHTS=quantized
  MLXCEL_DTYPE=float16``, mlxcel's CPU kernels off): MLX's quantized modules, float16 compute;
- ``cpu``: the default CPU profile, quantized matrices packed for mlxcel's own kernels.

    ./scripts/with-blas .venv/bin/python scripts/measure_load_memory.py -m models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

Prints one markdown row per profile: the weights' bytes, VmRSS (and its anonymous and file-backed
parts) at each point, the peak (VmHWM), and the goal of issue 42, resident after the generation
<= 1.2 x the file + 300 MB. On a CPU the native profile's generation is slow (MLX's float16
quantized matmul there runs about 15x slower than float32), hence the few tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROFILES = {
    "native": {"MLXCEL_WEIGHTS": "quantized", "MLXCEL_DTYPE": "float16", "MLXCEL_CPU_KERNELS": "0"},
    "cpu": {},
}
FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def status_mb() -> dict[str, float]:
    """This process's memory lines of /proc/self/status, in MB (10^6 bytes)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in FIELDS:
            out[key] = int(value.split()[0]) * 1024 / 1e6
    return out


def measure(model: str, prompt: str, n_predict: int) -> dict:
    """Run in the child: load ``model``, generate, report memory at each point as JSON."""
    import gc

    import mlx.core as mx

    from mlxcel.engine.model.loading import load_model

    report = {"imports": status_mb()}
    start = time.perf_counter()
    loaded = load_model(model)
    gc.collect()
    report.update(load_s=time.perf_counter() - start, load=status_mb(),
                  weights_mb=loaded.metadata.get("weight_bytes", 0) / 1e6)
    cache, x, tokens = loaded.make_cache(), mx.array([loaded.tokenizer.encode(prompt)]), []
    start = time.perf_counter()
    for _ in range(n_predict):
        tokens.append(int(mx.argmax(loaded.model(x, cache=cache)[0, -1]).item()))
        x = mx.array([[tokens[-1]]])
    report.update(generate_s=time.perf_counter() - start, generated=loaded.tokenizer.decode(tokens),
                  generate=status_mb())
    return report


def run_profile(name: str, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PROFILES["native"]}
    env.update(PROFILES[name])
    cmd = [sys.executable, __file__, "--child", "-m", args.model, "--prompt", args.prompt,
           "--n-predict", str(args.n_predict)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--profiles", default="native,cpu", help="comma-separated: " + ", ".join(PROFILES))
    parser.add_argument("--prompt", default="def fib(n):")
    parser.add_argument("--n-predict", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.prompt, args.n_predict)))
        return
    file_mb = Path(args.model).stat().st_size / 1e6
    goal = 1.2 * file_mb + 300
    print(f"file {file_mb:.0f} MB; goal: RSS after the generation <= 1.2 x file + 300 MB = {goal:.0f} MB")
    print("| profile | weights MB | RSS after imports | after load (anon / file) | after generation (anon / file) "
          "| peak | load s | generation s | goal met |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.profiles.split(","):
        r = run_profile(name, args)
        imp, load, gen = r["imports"], r["load"], r["generate"]
        print(f"| {name} | {r['weights_mb']:.0f} | {imp['VmRSS']:.0f} | {load['VmRSS']:.0f} "
              f"({load['RssAnon']:.0f} / {load['RssFile']:.0f}) | {gen['VmRSS']:.0f} "
              f"({gen['RssAnon']:.0f} / {gen['RssFile']:.0f}) | {gen['VmHWM']:.0f} | {r['load_s']:.1f} "
              f"| {r['generate_s']:.1f} | {'yes' if gen['VmRSS'] <= goal else 'no'} |", flush=True)
        print(f"  {name} generated: {r['generated']!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
