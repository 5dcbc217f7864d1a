#!/usr/bin/env python
"""Profile of one plain decode step on this machine, by op category.

MLX has no op-level profiler on the CPU, so each category is timed as an isolated, evaluated
sub-graph that does exactly what a decode step does for it, across *all* layers in one
evaluation (so the weights stream from memory as they do in a real step instead of sitting warm
in cache): the q/k/v/o projections of every layer, the MLP projections, the attention core
(``mx.fast.scaled_dot_product_attention`` over each layer's real KV cache), rope, RMS norms,
the element-wise ops (SwiGLU, residual adds), the KV-cache writes, the embedding lookup, the
output head, the sampler (greedy and llama-server's default chain), one host sync, and the
Python time to build the step's graph. The parts are then compared with a measured full step
(graph build + evaluation).

It also measures the machine's memory bandwidth (numpy and MLX reductions over 512 MB) and
derives the floor: weight bytes read per token / bandwidth.

    ./scripts/with-blas .venv/bin/python scripts/profile_decode.py                 # SmolLM2, f32
    OPENBLAS_NUM_THREADS=1 ./scripts/with-blas .venv/bin/python scripts/profile_decode.py --markdown

Every number is the median of ``--reps`` repetitions; record ``uptime`` with it (the script
prints the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import mlx.core as mx
import numpy as np


def median_ms(fn, reps: int) -> float:
    fn()
    fn()
    xs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e3


def bandwidth(reps: int = 7, mb: int = 512) -> dict:
    """GB/s of a streaming read (sum) and copy over ``mb`` MB, numpy and MLX."""
    n = mb * (1 << 20) // 4
    a = np.random.default_rng(0).random(n, dtype=np.float32)
    b = np.empty_like(a)
    m = mx.array(a)
    mx.eval(m)
    size = a.nbytes / 1e9
    out = {
        "numpy_sum_gbs": size / (median_ms(lambda: a.sum(), reps) / 1e3),
        "numpy_copy_gbs": 2 * size / (median_ms(lambda: np.copyto(b, a), reps) / 1e3),
        "mlx_sum_gbs": size / (median_ms(lambda: mx.eval(m.sum()), reps) / 1e3),
        "mlx_copy_gbs": 2 * size / (median_ms(lambda: mx.eval(m + 0), reps) / 1e3),
    }
    return out


def weight_bytes_per_token(model) -> int:
    """Bytes of every weight a one-token forward reads: all layer weights and the head (the
    embedding lookup reads one row)."""
    from mlx.utils import tree_flatten

    total = 0
    for name, v in tree_flatten(model.parameters()):
        if "embed_tokens" in name and not getattr(model.args, "tie_word_embeddings", False):
            continue  # an untied embedding table is read one row per token
        total += v.nbytes
    if not getattr(model.args, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
        pass  # lm_head is already counted above
    return total


def profile(loaded, context: int, reps: int) -> dict:
    from mlx_lm.models.activations import swiglu
    from mlx_lm.models.base import scaled_dot_product_attention

    from mlxcel.engine.cache.kv_cache import rewind
    from mlxcel.engine.cache.prefill import prefill
    from mlxcel.engine.sampling.chain import SamplerChain
    from mlxcel.engine.sampling.params import SamplerParams

    model = loaded.model
    inner = model.model
    layers = inner.layers
    args = model.args
    tokenizer = loaded.tokenizer
    text = "The history of computing is a story of abstraction layered on abstraction. " * 40
    prompt = list(tokenizer.encode(text, add_special_tokens=False))[:context]
    cache = loaded.make_cache()
    logits = prefill(model, prompt, cache)
    y = mx.argmax(logits).reshape(1)
    mx.eval(y, logits)

    # The real step: graph build (Python) and evaluation, separately.
    def build():
        return model(y[None], cache=cache)

    builds, evals = [], []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        out = build()
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        rewind(cache, 1)
        if i >= 2:
            builds.append(t1 - t0)
            evals.append(t2 - t1)
    full_build = statistics.median(builds) * 1e3
    full_eval = statistics.median(evals) * 1e3

    D = args.hidden_size
    x = mx.random.normal((1, 1, D))
    attn0 = layers[0].self_attn
    n_heads, n_kv = attn0.n_heads, attn0.n_kv_heads
    # not every family's attention keeps head_dim (Qwen2's does not): the cache's key width is it
    hd = getattr(attn0, "head_dim", None) or cache[0].keys.shape[-1]
    q = mx.random.normal((1, n_heads, 1, hd))
    k1 = mx.random.normal((1, n_kv, 1, hd))
    gate = layers[0].mlp.gate_proj
    mlp_hidden = (gate.weight_spec if hasattr(gate, "weight_spec") else gate.weight).shape[0]
    g = mx.random.normal((1, 1, mlp_hidden))
    u = mx.random.normal((1, 1, mlp_hidden))
    o_in = mx.random.normal((1, 1, n_heads * hd))
    d_in = mx.random.normal((1, 1, mlp_hidden))
    kv = [(c.keys[..., : c.offset, :], c.values[..., : c.offset, :]) for c in cache]
    mx.eval(x, q, k1, g, u, o_in, d_in, kv)
    offset = cache[0].offset

    def ev(f):
        return lambda: mx.eval(f())

    parts: dict[str, float] = {}
    parts["matmul q/k/v/o"] = median_ms(ev(lambda: [
        (l.self_attn.q_proj(x), l.self_attn.k_proj(x), l.self_attn.v_proj(x), l.self_attn.o_proj(o_in))
        for l in layers]), reps)
    parts["matmul MLP gate/up/down"] = median_ms(ev(lambda: [
        (l.mlp.gate_proj(x), l.mlp.up_proj(x), l.mlp.down_proj(d_in)) for l in layers]), reps)
    if getattr(args, "tie_word_embeddings", False):
        head = lambda h: inner.embed_tokens.as_linear(h)  # noqa: E731
    else:
        head = model.lm_head
    parts["output head"] = median_ms(ev(lambda: head(x)), reps)
    parts["attention (sdpa)"] = median_ms(ev(lambda: [
        scaled_dot_product_attention(q, kk, vv, cache=None, scale=l.self_attn.scale, mask=None)
        for l, (kk, vv) in zip(layers, kv)]), reps)
    parts["rope"] = median_ms(ev(lambda: [
        (l.self_attn.rope(q, offset=offset), l.self_attn.rope(k1, offset=offset)) for l in layers]), reps)
    parts["rms norms"] = median_ms(ev(lambda: [
        (l.input_layernorm(x), l.post_attention_layernorm(x)) for l in layers] + [inner.norm(x)]), reps)
    parts["elementwise (swiglu, residuals)"] = median_ms(ev(lambda: [
        (swiglu(g + 0.0 * i, u), x + o_in + 0.0 * i, x + x + 0.0 * i) for i, _ in enumerate(layers)]), reps)

    def cache_writes():
        outs = [c.update_and_fetch(k1, k1) for c in cache]
        mx.eval(outs)
        rewind(cache, 1)

    parts["KV-cache writes"] = median_ms(cache_writes, reps)
    parts["embedding lookup"] = median_ms(ev(lambda: inner.embed_tokens(y[None])), reps)

    greedy = SamplerChain(SamplerParams(temperature=0.0), vocab_size=loaded.vocab_size)
    default = SamplerChain(SamplerParams(), vocab_size=loaded.vocab_size)
    hist = list(prompt)
    parts["sampler: greedy"] = median_ms(ev(lambda: greedy.pick(logits[None], hist, seed=0,
                                                                 first_position=len(hist))), reps)
    sampler_default = median_ms(ev(lambda: default.pick(logits[None], hist, seed=0, first_position=len(hist))),
                                reps)
    parts["host sync (eval + item)"] = median_ms(lambda: (mx.eval(y + 1), (y + 1).item()), reps)
    parts["python graph build"] = full_build

    weights = weight_bytes_per_token(model)
    return {
        "context": offset, "reps": reps, "full_step_build_ms": full_build, "full_step_eval_ms": full_eval,
        "full_step_ms": full_build + full_eval, "parts_ms": parts, "parts_sum_ms": sum(parts.values()),
        "sampler_default_chain_ms": sampler_default, "weight_bytes_per_token": weights,
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or model dir (default: the built-in SmolLM2)")
    parser.add_argument("--context", type=int, default=128, help="tokens in the KV cache during the step")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    parser.add_argument("--no-bandwidth", action="store_true")
    args = parser.parse_args()

    from mlxcel.engine.platform.device import reexec_with_fast_blas

    reexec_with_fast_blas()
    from mlxcel.engine.model.loading import load_model

    loaded = load_model(args.model)
    result = {"model": loaded.path.name, "load_avg": os.getloadavg(), **profile(loaded, args.context, args.reps)}
    if not args.no_bandwidth:
        bw = bandwidth()
        result["bandwidth"] = bw
        best = max(bw.values())
        result["floor_ms"] = result["weight_bytes_per_token"] / 1e9 / best * 1e3
    print(json.dumps(result))
    if args.markdown:
        full = result["full_step_ms"]
        print(f"\nload average {result['load_avg'][0]:.1f}; context {result['context']}; "
              f"OpenBLAS threads {result['openblas_threads']}\n")
        print("| category | ms per step | share of full step |")
        print("|---|---:|---:|")
        for name, ms in sorted(result["parts_ms"].items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {ms:.2f} | {ms / full:.0%} |")
        print(f"| **sum of parts** | **{result['parts_sum_ms']:.2f}** | {result['parts_sum_ms'] / full:.0%} |")
        print(f"| **measured full step** (build {result['full_step_build_ms']:.2f} + eval "
              f"{result['full_step_eval_ms']:.2f}) | **{full:.2f}** | 100% |")
        print(f"\nsampler, llama-server default chain: {result['sampler_default_chain_ms']:.2f} ms; "
              f"weights read per token: {result['weight_bytes_per_token'] / 1e6:.0f} MB")
        if "bandwidth" in result:
            print("bandwidth GB/s: " + ", ".join(f"{k} {v:.1f}" for k, v in result["bandwidth"].items())
                  + f"; floor {result['floor_ms']:.1f} ms/token = {1e3 / result['floor_ms']:.0f} tok/s")


if __name__ == "__main__":
    main()
