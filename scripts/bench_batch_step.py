#!/usr/bin/env python
"""The ceiling on a batching server's decode throughput: the time of one batched forward.

For B = 1, 2, 4, 8 rows, each prefilled with its own prompt, time one ``DecodeBatch.step`` (one
token per row through the model, the server's decode step) and report B / step time: no server
that runs this model's forward can decode B concurrent streams faster than that.

    ./scripts/with-blas .venv/bin/python scripts/bench_batch_step.py [-m MODEL] [--rows 1,2,4,8]
"""

from __future__ import annotations

import argparse
import time


def best_ms(fn, iters: int, repeats: int = 3) -> float:
    fn()
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="model (default: the built-in SmolLM2)")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()

    from mlxcel.engine.decode.batch import DecodeBatch
    from mlxcel.engine.decode.plain import prefill
    from mlxcel.engine.model.loading import load_model

    lm = load_model(args.model)
    base = None
    print("| rows | step ms | step / 1-row step | ceiling tok/s |\n|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        batch = DecodeBatch(lm.model)
        for r in range(rows):
            cache = lm.make_cache()
            prefill(lm.model, lm.tokenizer.encode(f"Prompt {r}: describe the weather in a city you like."), cache)
            batch.add(r, cache)
        ms = best_ms(lambda: batch.step([1] * rows), args.iters)
        base = base or ms
        print(f"| {rows} | {ms:.1f} | {ms / base:.2f}x | {rows / ms * 1000:.1f} |", flush=True)


if __name__ == "__main__":
    main()
