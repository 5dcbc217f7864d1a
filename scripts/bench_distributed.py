#!/usr/bin/env python
"""Memory and decode speed per rank of a model split across ranks, against one process.

Run it once alone and once under mlx.launch; each run appends one JSON line per rank to --out:

    ./scripts/with-blas .venv/bin/python scripts/bench_distributed.py --out /tmp/dist.jsonl
    .venv/bin/mlx.launch -n 2 --backend ring -- ./scripts/with-blas .venv/bin/python \\
        scripts/bench_distributed.py --out /tmp/dist.jsonl

It measures, on this rank: the resident weights (bytes of the shard's parameters) and the peak
RSS; the time of one decode step (one token through the model, ``forward_chunk``), as tokens/s;
and the cost of the collectives alone: the lockstep's per-iteration header (one ``all_sum`` of a
few int32) and one ``all_sum`` of a hidden-state row, the collective a sharded layer pays twice.

Default model: a llama-style random checkpoint written to --build (hidden 1024, 8 layers, 16
heads, 8 KV heads, float32, or --bits 4 for an MLX 4-bit checkpoint that the CPU kernels run);
SmolLM2-135M has 9 heads and 3 KV heads, which two ranks cannot split. -m takes any other model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(out: Path, bits: int) -> Path:
    if (out / "config.json").is_file():
        return out
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    import tiny_checkpoints

    out.mkdir(parents=True, exist_ok=True)
    vocab = tiny_checkpoints.build_tokenizer(out)
    config = tiny_checkpoints.tiny_config("llama", vocab, layers=8, hidden=1024)
    config.update(num_attention_heads=16, num_key_value_heads=8, intermediate_size=2816)
    params = tiny_checkpoints.random_params(config, seed=7)
    if bits:
        from mlx_lm.models.llama import Model, ModelArgs

        model = Model(ModelArgs.from_dict(config))
        model.load_weights(list(params.items()))
        nn.quantize(model, group_size=64, bits=bits)
        params = dict(tree_flatten(model.parameters()))
        config["quantization"] = {"group_size": 64, "bits": bits}
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def best_ms(fn, iters: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters)
    return best * 1000


def rss_mib(key: str = "VmHWM") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--build", default="/tmp/mlxcel-bench-dist", help="where the default checkpoint is written")
    ap.add_argument("--bits", type=int, default=0, help="0: float32; 4 or 8: an MLX-quantized checkpoint")
    ap.add_argument("--split-mode", default="row")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default=None, help="append the JSON line here (rank 0 prints it too)")
    args = ap.parse_args()

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxcel.drafters.loading import load_target
    from mlxcel.engine.cache.batch import forward_chunk
    from mlxcel.engine.distributed.collectives import sum_ints
    from mlxcel.engine.distributed.sharding import sharder, unpacked_loading
    from mlxcel.engine.distributed.world import world

    model = args.model or str(build(Path(f"{args.build}-q{args.bits}" if args.bits else args.build), args.bits))
    group = world()
    shard = None
    if group is not None:
        unpacked_loading()
        shard = sharder(group, args.split_mode, None)
    lm = load_target(model, shard=shard)
    weights = sum(v.nbytes for _, v in tree_flatten(lm.model.parameters()))
    cache = lm.make_cache()
    forward_chunk(lm.model, list(range(3, 67)), cache)
    step_ms = best_ms(lambda: forward_chunk(lm.model, [5], cache), args.steps)
    row = {"ranks": group.size() if group else 1, "rank": group.rank() if group else 0, "model": Path(model).name,
           "split_mode": args.split_mode if group else "none", "weights_mib": round(weights / 2**20, 1),
           "peak_rss_mib": round(rss_mib(), 1), "rss_mib": round(rss_mib("VmRSS"), 1), "decode_step_ms": round(step_ms, 2),
           "tokens_per_s": round(1000 / step_ms, 2)}
    if group is not None:
        hidden = mx.zeros((1, 1, int(lm.config["hidden_size"])), dtype=mx.float32)
        row["header_all_sum_ms"] = round(best_ms(lambda: sum_ints(group, [0] * (3 + group.size())), 30), 3)
        row["hidden_all_sum_ms"] = round(best_ms(lambda: mx.eval(mx.distributed.all_sum(hidden, group=group)), 30), 3)
        n_layers = len(getattr(lm.model, "layers", []))
        row["collectives_per_step"] = 1 + (2 * n_layers if args.split_mode == "row" else 2)
    line = json.dumps(row)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
