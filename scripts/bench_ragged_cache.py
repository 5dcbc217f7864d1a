#!/usr/bin/env python
"""The cache design behind the speculating rows' shared verify forward, measured: one iteration's
verify blocks for ``B`` rows (each row its own context length, a block of ``k + 1`` tokens, then a
rewind of its rejected tail) three ways, on the same model, interleaved, best of ``--repeats``:

* ``per-row``: what the server did before: one forward per row on its own ``KVCache``, ``rewind``;
* ``concat``: the rows keep their own caches; every iteration copies them into one padded batch,
  runs one forward, and copies each row back (the "separate caches concatenated per step" design);
* ``ragged``: the rows live in one ``cache.ragged.RaggedBatch`` (per-row lengths, O(1) per-row rewind).

    ./scripts/with-blas .venv/bin/python scripts/bench_ragged_cache.py [--rows 4] [--context 300] [--block 4]
"""

from __future__ import annotations

import argparse
import random
import time

import mlx.core as mx

from mlxcel.engine.cache.kv_cache import rewind
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan
from mlxcel.engine.model.loading import default_model_path, load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--context", type=int, default=300, help="context tokens of the longest row (others shorter)")
    ap.add_argument("--block", type=int, default=4, help="tokens per row per iteration (pending + drafts)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    lm = load_model(args.model or default_model_path())
    model = lm.model
    rng = random.Random(0)
    lengths = [args.context - 37 * i for i in range(args.rows)]
    contexts = [[rng.randrange(1000, 20000) for _ in range(n)] for n in lengths]
    drop = [i % args.block for i in range(args.rows)]  # rejected tail per row: every regime at once

    def fresh():
        caches = []
        for c in contexts:
            cache = lm.make_cache()
            model(mx.array([c]), cache=cache)
            mx.eval([x.state for x in cache])
            caches.append(cache)
        return caches

    def blocks(step):
        return [[rng.randrange(1000, 20000) for _ in range(args.block)] for _ in range(args.rows)]

    def per_row(caches):
        for step in range(args.steps):
            for cache, block, d in zip(caches, blocks(step), drop):
                mx.eval(model(mx.array([block]), cache=cache))
                rewind(cache, d)

    def concat(caches):
        for step in range(args.steps):
            batch = RaggedBatch(model)
            for i, cache in enumerate(caches):
                batch.add(i, cache)
            plan = StepPlan()
            for i, block in enumerate(blocks(step)):
                plan.add(i, block, batch.length(i))
            mx.eval(batch.forward(plan))
            for i, d in enumerate(drop):
                batch.rewind(i, d)
            out = batch.remove(list(range(len(caches))))
            caches[:] = [out[i] for i in range(len(caches))]
            mx.eval([x.state for c in caches for x in c])

    def ragged(caches):
        batch = RaggedBatch(model)
        for i, cache in enumerate(caches):
            batch.add(i, cache)
        for step in range(args.steps):
            plan = StepPlan()
            for i, block in enumerate(blocks(step)):
                plan.add(i, block, batch.length(i))
            mx.eval(batch.forward(plan))
            for i, d in enumerate(drop):
                batch.rewind(i, d)

    arms = {"per-row": per_row, "concat": concat, "ragged": ragged}
    best = {name: float("inf") for name in arms}
    for rep in range(args.repeats):
        for name in (list(arms) if rep % 2 == 0 else list(arms)[::-1]):
            caches = fresh()
            t0 = time.perf_counter()
            arms[name](caches)
            best[name] = min(best[name], (time.perf_counter() - t0) / args.steps)
    print(f"{args.rows} rows, contexts {lengths}, block {args.block}, best of {args.repeats} x {args.steps} iterations")
    print("| design | ms per iteration | vs per-row |")
    print("|---|---|---|")
    for name, t in best.items():
        print(f"| {name} | {t * 1e3:.1f} | {best['per-row'] / t:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
