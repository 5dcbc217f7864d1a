"""Benchmark the sampler chain against a minimal sampler in the same run.

Baseline: ``softmax(logits / T)`` + one categorical draw per row (no bias, penalties or
filters). Reported as the ratio chain / baseline (best of N, interleaved) per configuration
and block size, so the numbers travel between machines. Run:

    ./scripts/with-blas .venv/bin/python scripts/bench_sampler.py [--vocab 49152] [--history 4096]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import mlx.core as mx
import numpy as np

from mlxcel.engine.sampling.chain import SamplerChain, position_keys
from mlxcel.engine.sampling.params import SamplerParams

_categorical = mx.vmap(lambda logp, key: mx.random.categorical(logp, key=key))


def timed_pair(baseline, candidate, reps: int) -> tuple[float, float]:
    """Best-of-``reps`` milliseconds for each, the two calls interleaved so that load from other
    processes hits both alike."""
    for _ in range(3):
        baseline()
        candidate()
    best_b = best_c = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        baseline()
        t1 = time.perf_counter()
        candidate()
        t2 = time.perf_counter()
        best_b, best_c = min(best_b, t1 - t0), min(best_c, t2 - t1)
    return best_b * 1000, best_c * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--history", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    history = rng.integers(0, 2000, size=args.history).tolist()
    base = SamplerParams()
    configs = {
        "defaults (top-k 40, top-p, min-p)": base,
        "greedy select": replace(base, temperature=0.0),
        "no top-k (full sort)": replace(base, top_k=0),
        "typical + XTC": replace(base, typical_p=0.9, xtc_probability=0.5),
        "penalties (last 64)": replace(base, repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5),
        "penalties (whole history)": replace(base, repeat_penalty=1.1, repeat_last_n=-1),
        "DRY (last 64)": replace(base, dry_multiplier=0.8),
        "DRY (whole history)": replace(base, dry_multiplier=0.8, dry_penalty_last_n=-1),
    }
    print(f"vocab {args.vocab}, history {args.history}, device {mx.default_device()}")
    print(f"{'config':36s} {'rows':>4s} {'baseline ms':>12s} {'chain ms':>9s} {'ratio':>6s}")
    for rows in (1, 8):
        logits = mx.random.normal((rows, args.vocab)) * 3
        mx.eval(logits)
        appended = list(range(rows - 1))

        def baseline():
            probs = mx.softmax(logits / 0.8, axis=-1)
            _categorical(mx.log(probs), position_keys(1, 0, rows)).tolist()

        for name, params in configs.items():
            chain = SamplerChain(params, vocab_size=args.vocab)
            base_ms, ms = timed_pair(
                baseline, lambda: chain.select(logits, history, appended, seed=1, first_position=len(history)), args.reps)
            print(f"{name:36s} {rows:4d} {base_ms:12.3f} {ms:9.3f} {ms / base_ms:6.2f}")


if __name__ == "__main__":
    main()
