#!/usr/bin/env python
"""KV cache types (``-ctk`` / ``-ctv``) on the MLX-native profile: the cache's memory and the decode
speed at a given context, per type, in one run.

For each context length and cache type the built-in SmolLM2 (or ``-m``) gets a fresh cache filled to
that length with random keys and values (what a prefill leaves there, without paying the prefill),
then decodes ``--steps`` tokens; reported: the cache's bytes and the decode tokens/s. Run it on the
MLX-native profile (what Metal and CUDA run):

    MLXCEL_KERNELS=mlx MLXCEL_DTYPE=float32 ./scripts/with-blas .venv/bin/python scripts/bench_kv_cache.py \\
        [--contexts 4096,32768] [--types f32,q8_0,q4_0] [--steps 8]

(``MLXCEL_DTYPE=float32`` on a CPU: MLX's CPU float16 matmuls are an order of magnitude slower than
float32 ones, which would hide the cache's share.)
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from mlxcel.engine.model.kv_types import KvQuant, resolve
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform import device


def fill(cache: list, length: int, dtype) -> None:
    """Every attention layer holds ``length`` random positions."""
    for c in cache:
        if not hasattr(c, "update_and_fetch"):
            continue
        shape = getattr(c, "_mlxcel_shape", None)
        keys = mx.random.normal(shape[:2] + (length,) + shape[3:]).astype(dtype)
        c.update_and_fetch(keys, keys)
    mx.eval([c.state for c in cache])


def nbytes(cache: list) -> int:
    total = 0
    for c in cache:
        for part in (c.keys, c.values) if hasattr(c, "keys") and c.keys is not None else ():
            total += sum(a.nbytes for a in (part if isinstance(part, tuple | list) else [part]))
    return total


def kv_shape(lm) -> tuple:
    c = lm.config
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return (1, c.get("num_key_value_heads", heads), 0, head_dim)


def measure(lm, quant: KvQuant | None, length: int, steps: int) -> tuple[float, float]:
    lm.kv_quant = quant
    cache = lm.make_cache()
    for c in cache:
        c._mlxcel_shape = kv_shape(lm)
    fill(cache, length, device.compute_dtype())
    token = mx.array([[1]])
    mx.eval(lm.model(token, cache=cache))  # warm
    start = time.perf_counter()
    for _ in range(steps):
        mx.eval(lm.model(token, cache=cache))
    return nbytes(cache) / 2**20, steps / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--types", default="f32,q8_0,q4_0")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    if not device.mlx_native():
        raise SystemExit("run on the MLX-native profile: MLXCEL_KERNELS=mlx (module docstring)")
    lm = load_model(args.model)
    dtype = str(device.compute_dtype()).removeprefix("mlx.core.")
    print(f"model {lm.path.name}, compute {dtype}, {args.steps} decode steps per cell")
    print(f"{'context':>8} {'type':>6} {'cache MiB':>10} {'tok/s':>8}")
    for length in (int(x) for x in args.contexts.split(",")):
        for name in args.types.split(","):
            full = name in ("f32", "f16", "bf16")
            quant = None if full else resolve(name, name, compute_dtype=dtype, mlx_native=True)
            mib, tps = measure(lm, quant, length, args.steps)
            print(f"{length:>8} {name:>6} {mib:>10.1f} {tps:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
