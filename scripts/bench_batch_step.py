#!/usr/bin/env python
"""The ceiling on a batching server's decode throughput: the time of one batched forward.

For B = 1, 2, 4, 8 rows, each prefilled with its own prompt, time one ``DecodeBatch.step`` (one
token per row through the model, the server's decode step) and report B / step time: no server
that runs this model's forward can decode B concurrent streams faster than that.

``--ragged`` times the same step as one ``RaggedBatch`` forward too (each row its one token at its
own position, the server's unified step), interleaved with the ``DecodeBatch`` step, repeat by
repeat, and reports wall and process CPU time of both (the CPU time is less moved by other load).

    ./scripts/with-blas .venv/bin/python scripts/bench_batch_step.py [-m MODEL] [--rows 1,2,4,8] [--ragged]
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
    ap.add_argument("--ragged", action="store_true", help="also time the ragged batch's one-token step")
    args = ap.parse_args()
    if args.ragged:
        compare(args)
        return

    from mlxcel.engine.cache.batch import DecodeBatch
    from mlxcel.engine.cache.prefill import prefill
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


def compare(args) -> None:
    import mlx.core as mx

    from mlxcel.engine.cache.batch import DecodeBatch
    from mlxcel.engine.cache.prefill import prefill
    from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan
    from mlxcel.engine.model.loading import load_model

    lm = load_model(args.model)
    print("| rows | DecodeBatch ms (cpu ms) | ragged ms (cpu ms) | ragged / DecodeBatch wall | cpu |")
    print("|---:|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        batch, ragged = DecodeBatch(lm.model), RaggedBatch(lm.model)
        for r in range(rows):
            cache = lm.make_cache()
            prefill(lm.model, lm.tokenizer.encode(f"Prompt {r}: describe the weather in a city you like."), cache)
            batch.add(r, cache)
            ragged.add(r, cache)

        def ragged_step():
            plan = StepPlan()
            for r in ragged.rows:
                plan.add(r, [1], ragged.length(r))
            mx.eval(ragged.forward(plan))
            for r in ragged.rows:
                ragged.rewind(r, 1)  # the same context every step, as the DecodeBatch arm's grows by one

        arms = {"batch": lambda: batch.step([1] * rows), "ragged": ragged_step}
        wall = {k: float("inf") for k in arms}
        cpu = {k: float("inf") for k in arms}
        for fn in arms.values():
            fn()
            fn()
        for _ in range(5):
            for name, fn in arms.items():
                w, c = time.perf_counter(), time.process_time()
                for _ in range(args.iters):
                    fn()
                wall[name] = min(wall[name], (time.perf_counter() - w) / args.iters * 1000)
                cpu[name] = min(cpu[name], (time.process_time() - c) / args.iters * 1000)
        print(f"| {rows} | {wall['batch']:.1f} ({cpu['batch']:.1f}) | {wall['ragged']:.1f} ({cpu['ragged']:.1f}) | "
              f"{wall['ragged'] / wall['batch']:.2f}x | {cpu['ragged'] / cpu['batch']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
