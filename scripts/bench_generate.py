#!/usr/bin/env python
"""Plain-decode benchmark: mlxcel's decode loop against mlx-lm's ``generate_step``.

Fairness: both sides run the *same model object* in the same process (mlxcel's ``load_model``,
so a GGUF is loaded once, with the device policy of ``engine/platform/device.py``: float32 weights and
OpenBLAS on a Linux CPU), greedy, no EOS stop, no detokenization, on the same prompt. Runs are
interleaved (mlxcel, mlx-lm, mlxcel, ...) and the best of N is kept for each, so background load
hits both alike. Both are timed with one clock and one definition:

    prefill tok/s = prompt tokens / (time to the first generated token)
    decode tok/s  = (generated tokens - 1) / (time from the first to the last token)

``--policy`` measures the device-policy facts instead (one child process per configuration,
because the BLAS library is chosen at process start): decode and prefill tok/s of mlxcel's loop
and the cost of a forward over 8 tokens relative to one token.

    ./scripts/with-blas .venv/bin/python scripts/bench_generate.py            # or: make bench
    ./scripts/with-blas .venv/bin/python scripts/bench_generate.py --policy

``--paths`` measures the CPU decode speed paths one by one (``docs/benchmarks.md``, "Decode speed
on the CPU"), switched on and off inside one process, configurations interleaved run by run
(A B C A B C ...): median decode tok/s and forward x8 / x1 per configuration, each relative to the
first (everything off):

    ./scripts/with-blas .venv/bin/python scripts/bench_generate.py --paths --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT_TEXT = (
    "The history of computing is a story of abstraction layered on abstraction. Early machines were "
    "programmed by rewiring panels; later, stored programs let the same hardware run many tasks. "
    "Compilers turned human-readable code into machine instructions, operating systems shared one "
    "machine among many users, and networks joined machines into systems spanning the globe. "
)


def blas_in_use() -> str:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    return "openblas" if "libopenblas" in maps else "bundled"


def prompt_tokens(loaded, n: int) -> list[int]:
    ids = loaded.tokenizer.encode(PROMPT_TEXT * (1 + n // 40), add_special_tokens=False)
    return list(ids[:n])


def time_mlxcel(loaded, prompt: list[int], n: int) -> tuple[float, float, list[int]]:
    from mlxcel.engine.decode.plain import generate_tokens
    from mlxcel.engine.sampling.chain import SamplerChain
    from mlxcel.engine.sampling.params import SamplerParams

    chain = SamplerChain(SamplerParams(temperature=0.0), vocab_size=loaded.vocab_size, eos_token_ids=())
    start = time.perf_counter()
    first = None
    tokens = []
    for step in generate_tokens(loaded.model, prompt, chain, cache=loaded.make_cache(), max_tokens=n,
                                eos_token_ids=()):
        tokens.append(step.token)
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return len(prompt) / (first - start), (n - 1) / (end - first), tokens


def time_mlx_lm(loaded, prompt: list[int], n: int) -> tuple[float, float, list[int]]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    start = time.perf_counter()
    first = None
    tokens = []
    for token, _ in generate_step(mx.array(prompt), loaded.model, max_tokens=n):
        tokens.append(int(token))
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return len(prompt) / (first - start), (n - 1) / (end - first), tokens


def compare(args) -> dict:
    from mlxcel.engine.model.loading import load_model

    loaded = load_model(args.model)
    prompt = prompt_tokens(loaded, args.prompt_tokens)
    # Warm-up (first-call allocations, kernel setup) for both.
    time_mlxcel(loaded, prompt[:16], 4)
    time_mlx_lm(loaded, prompt[:16], 4)
    ours, theirs = [], []
    for _ in range(args.runs):
        ours.append(time_mlxcel(loaded, prompt, args.gen_tokens))
        theirs.append(time_mlx_lm(loaded, prompt, args.gen_tokens))
    best = lambda runs, i: max(r[i] for r in runs)  # noqa: E731
    result = {
        "model": str(loaded.path.name), "blas": blas_in_use(), "prompt_tokens": len(prompt),
        "gen_tokens": args.gen_tokens, "runs": args.runs,
        "mlxcel_prefill_tps": best(ours, 0), "mlx_lm_prefill_tps": best(theirs, 0),
        "mlxcel_decode_tps": best(ours, 1), "mlx_lm_decode_tps": best(theirs, 1),
        "same_tokens": ours[0][2] == theirs[0][2],
    }
    result["prefill_ratio"] = result["mlxcel_prefill_tps"] / result["mlx_lm_prefill_tps"]
    result["decode_ratio"] = result["mlxcel_decode_tps"] / result["mlx_lm_decode_tps"]
    return result


def forward_cost_ratio(loaded, width: int = 8, context: int = 64, reps: int = 15) -> float:
    """Median time of one forward over ``width`` new tokens / over 1 token, on a warm cache of
    ``context`` tokens (a verify round's shape vs a decode step's)."""
    import mlx.core as mx

    from mlxcel.engine.cache.kv_cache import rewind
    from mlxcel.engine.cache.prefill import prefill

    prompt = prompt_tokens(loaded, context)
    cache = loaded.make_cache()
    mx.eval(prefill(loaded.model, prompt, cache))

    def once(w: int) -> float:
        t = time.perf_counter()
        mx.eval(loaded.model(mx.array(prompt[:w])[None], cache=cache))
        dt = time.perf_counter() - t
        rewind(cache, w)
        return dt

    for w in (1, width):
        once(w)
    one = statistics.median(once(1) for _ in range(reps))
    many = statistics.median(once(width) for _ in range(reps))
    return many / one


def single(args) -> dict:
    """One configuration, as configured by this process's environment."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxcel.engine.model.loading import load_model

    loaded = load_model(args.model)
    dtypes = sorted({str(v.dtype).replace("mlx.core.", "") for _, v in tree_flatten(loaded.model.parameters())})
    prompt = prompt_tokens(loaded, args.prompt_tokens)
    time_mlxcel(loaded, prompt[:16], 4)
    runs = [time_mlxcel(loaded, prompt, args.gen_tokens) for _ in range(args.runs)]
    return {
        "blas": blas_in_use(), "weight_dtypes": dtypes, "device": str(mx.default_device()),
        "prefill_tps": max(r[0] for r in runs), "decode_tps": max(r[1] for r in runs),
        "forward8_over_forward1": forward_cost_ratio(loaded),
    }


POLICIES = {
    "f32 + OpenBLAS": {"MLXCEL_WEIGHTS": "float32", "MLXCEL_DTYPE": "float32"},
    "f32 + OpenBLAS, 1 thread": {"MLXCEL_WEIGHTS": "float32", "MLXCEL_DTYPE": "float32",
                                 "OPENBLAS_NUM_THREADS": "1"},
    "f32 + bundled BLAS": {"MLXCEL_WEIGHTS": "float32", "MLXCEL_DTYPE": "float32", "MLXCEL_BLAS_PRELOAD": "0"},
    "Q4_1 kept quantized (+ OpenBLAS)": {"MLXCEL_WEIGHTS": "quantized", "MLXCEL_DTYPE": "float32"},
    "bf16": {"MLXCEL_WEIGHTS": "float32", "MLXCEL_DTYPE": "bfloat16"},
    "f16": {"MLXCEL_WEIGHTS": "float32", "MLXCEL_DTYPE": "float16"},
}


def paths(args) -> dict:
    """The CPU decode speed paths toggled inside one process (same weights, same memory), run
    after run: the shim's sgemv switch (``blas_shim.set_sgemv``) and the rope modules swapped back
    and forth."""
    import mlx.nn as nn

    from mlxcel.engine.model.loading import load_model
    from mlxcel.engine.platform import blas_shim
    from mlxcel.engine.platform.compiled_rope import DecodeStepRoPE

    loaded = load_model(args.model)
    swaps = []
    for _, module in loaded.model.named_modules():
        for name, ch in module.children().items():
            if isinstance(ch, DecodeStepRoPE):
                plain = nn.RoPE(ch.dims, traditional=ch.traditional, base=ch.base, scale=ch.scale)
                swaps.append((module, name, plain, ch))
    if blas_shim.loaded_shim() is None:
        raise SystemExit("the sgemv shim is not loaded: run through scripts/with-blas")
    if not swaps:
        print("note: no compiled rope in this model (not a plain nn.RoPE, or not on a CPU)", file=sys.stderr)

    def configure(sgemv: bool, rope: bool) -> None:
        blas_shim.set_sgemv(sgemv)
        for module, name, plain, compiled in swaps:
            setattr(module, name, compiled if rope else plain)

    configs = {"baseline (sgemm, fast.rope)": (False, False), "+ one-row sgemv shim": (True, False),
               "+ compiled one-token rope": (True, True)}
    prompt = prompt_tokens(loaded, args.prompt_tokens)
    for sg, rp in configs.values():  # warm-up (compiles the rope once)
        configure(sg, rp)
        time_mlxcel(loaded, prompt[:16], 4)
    runs = {name: [] for name in configs}
    f8 = {name: [] for name in configs}
    tokens = {}
    load_start = os.getloadavg()[0]
    for _ in range(args.repeats):
        for name, (sg, rp) in configs.items():
            configure(sg, rp)
            _, tps, toks = time_mlxcel(loaded, prompt, args.gen_tokens)
            runs[name].append(tps)
            tokens.setdefault(name, toks)
            f8[name].append(forward_cost_ratio(loaded, reps=5))
    load_end = os.getloadavg()[0]
    configure(True, True)
    print(f"load average {load_start:.1f} -> {load_end:.1f}; {args.repeats} interleaved repeats; "
          f"{len(prompt)}-token prompt, {args.gen_tokens} tokens; OpenBLAS threads "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default')}")
    print("| configuration | decode tok/s (median) | vs baseline | forward x8 / x1 | same tokens |")
    print("|---|---:|---:|---:|---|")
    base = None
    summary = {}
    first = next(iter(tokens.values()))
    for name in configs:
        tps = statistics.median(runs[name])
        ratio = statistics.median(f8[name])
        base = base or tps
        summary[name] = {"decode_tps": tps, "forward8_over_forward1": ratio, "all": runs[name]}
        print(f"| {name} | {tps:.1f} | {tps / base:.2f}x | {ratio:.2f}x | {tokens[name] == first} |")
    return summary


def policy(args) -> list[dict]:
    rows = []
    for name, overrides in POLICIES.items():
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXCEL_BLAS_PRELOADED")}
        env.update(overrides)
        cmd = [sys.executable, __file__, "--single", "--runs", str(args.runs), "--prompt-tokens",
               str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)]
        if args.model:
            cmd += ["--model", args.model]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        row = {"config": name, **json.loads(out.strip().splitlines()[-1])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or model dir (default: the built-in SmolLM2)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs")
    parser.add_argument("--policy", action="store_true", help="measure the device-policy table instead")
    parser.add_argument("--paths", action="store_true", help="measure the CPU decode speed paths one by one")
    parser.add_argument("--repeats", type=int, default=3, help="--paths: interleaved repeats per configuration")
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    from mlxcel.engine.platform.device import reexec_with_fast_blas

    reexec_with_fast_blas()  # honours MLXCEL_BLAS_PRELOAD=0
    if args.single:
        print(json.dumps(single(args)))
    elif args.policy:
        policy(args)
    elif args.paths:
        print(json.dumps(paths(args)))
    else:
        r = compare(args)
        print(json.dumps(r))
        print(f"prefill ({r['prompt_tokens']} tokens): mlxcel {r['mlxcel_prefill_tps']:.1f} tok/s, "
              f"mlx-lm {r['mlx_lm_prefill_tps']:.1f} tok/s, ratio {r['prefill_ratio']:.2f}x")
        print(f"decode ({r['gen_tokens']} tokens): mlxcel {r['mlxcel_decode_tps']:.1f} tok/s, "
              f"mlx-lm {r['mlx_lm_decode_tps']:.1f} tok/s, ratio {r['decode_ratio']:.2f}x; "
              f"same greedy tokens: {r['same_tokens']}; BLAS: {r['blas']}")


if __name__ == "__main__":
    main()
