#!/usr/bin/env python
"""Replay prompt-lookup policies against what the model actually emits, offline, round by round.

At temperature 0 a lossless verify round emits exactly the plain greedy tokens, so the emitted
stream does not depend on the drafter: it is decoded once per workload (the chat prompts of
``bench_server_speculative.py``, through the model's chat template, on the built-in SmolLM2), and
every policy is then replayed against it as the server would run it (the server's block limit,
the governed drafter, its pauses and shadow lookups). Per policy and workload: target forwards,
tokens per forward, drafted / accepted tokens, and an estimated decode time from a measured
forward-cost table (seconds per forward of width 1..N on this machine, same run).

``--trace WORKLOAD`` prints each round of the server's policy: what lookup proposed, what the model
emitted, how many were accepted, and whether the row was paused.

    ./scripts/with-blas .venv/bin/python scripts/trace_prompt_lookup.py [--max-tokens 128] [--trace edit-code]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from bench_server_speculative import WORKLOADS  # noqa: E402


def decode_plain(loaded, prompt: str, max_tokens: int) -> tuple[list[int], list[int]]:
    from mlxcel.engine.decode.plain import generate_tokens
    from mlxcel.engine.sampling.chain import SamplerChain
    from mlxcel.engine.sampling.params import SamplerParams
    from mlxcel.server.http.chat.template import apply_template
    from mlxcel.server.http.prompts import tokenize_prompt

    text = apply_template(loaded.tokenizer, loaded.chat_template, [{"role": "user", "content": prompt}])
    ids = tokenize_prompt(loaded, [text])
    chain = SamplerChain(SamplerParams(temperature=0.0), vocab_size=loaded.vocab_size,
                         eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer)
    out = [s.token for s in generate_tokens(loaded.model, ids, chain, cache=loaded.make_cache(),
                                            max_tokens=max_tokens)]
    return ids, out


def forward_costs(loaded, context: int, widths: int, repeats: int = 9) -> list[float]:
    """Median seconds per target forward of width 1..widths after ``context`` cached tokens."""
    import mlx.core as mx

    from mlxcel.engine.cache.kv_cache import rewind

    cache = loaded.make_cache()
    mx.eval(loaded.model(mx.array([[1] * context]), cache=cache))
    costs = []
    for w in range(1, widths + 1):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            mx.eval(loaded.model(mx.array([[1] * w]), cache=cache))
            times.append(time.perf_counter() - t0)
            rewind(cache, w)
        costs.append(sorted(times)[len(times) // 2])  # median: the machine is shared
    return costs


def replay(make_drafter, n_max: int, prompt: list[int], emitted: list[int], trace=None) -> dict:
    """Run the server's round loop over a fixed emitted stream; returns forwards and widths."""
    from mlxcel.engine.sampling.params import SamplerParams

    drafter = make_drafter()
    drafter.start(prompt, SamplerParams(temperature=0.0), 0)
    seq = [*prompt, emitted[0]]  # the first token comes from the prefill
    pos, widths, drafted, accepted_total = 1, [], 0, 0
    while pos < len(emitted):
        remaining = len(emitted) - pos + 1
        k = min(n_max, remaining - 1)
        paused = getattr(drafter, "is_paused", False)
        proposal = drafter.propose(seq, k) if k > 0 else None
        tokens = proposal.tokens if proposal is not None else []
        acc = 0
        while acc < len(tokens) and pos + acc < len(emitted) and tokens[acc] == emitted[pos + acc]:
            acc += 1
        out = emitted[pos: pos + acc + 1]
        if trace is not None:
            trace(paused, tokens, out, acc)
        seq += out
        pos += len(out)
        widths.append(1 + len(tokens))
        drafted += len(tokens)
        accepted_total += acc
        if proposal is not None:
            drafter.observe(seq, proposal, acc)
    return {"widths": widths, "drafted": drafted, "accepted": accepted_total}


def replay_oracle(n_max: int, prompt: list[int], emitted: list[int]) -> dict:
    """The ceiling of any lookup: each round proposes the longest *correct* continuation among
    all earlier occurrences of the last token (every longer suffix match is one of them), and
    nothing when none is correct; it reads the answer, so no real drafter can beat it."""
    seq = [*prompt, emitted[0]]
    pos, widths, accepted_total = 1, [], 0
    while pos < len(emitted):
        k = min(n_max, len(emitted) - pos)
        best = 0
        last = seq[-1]
        for j in range(len(seq) - 1):
            if seq[j] != last:
                continue
            n = 0
            while n < k and j + 1 + n < len(seq) and pos + n < len(emitted) and seq[j + 1 + n] == emitted[pos + n]:
                n += 1
            best = max(best, n)
        out = emitted[pos: pos + best + 1]
        seq += out
        pos += len(out)
        widths.append(1 + best)
        accepted_total += best
    return {"widths": widths, "drafted": accepted_total, "accepted": accepted_total}


def policies(n_max: int):
    from mlxcel.drafters.lookup.governor import GovernedPromptLookupDrafter

    out = {
        "block 8, n 1..3 (before)": (lambda: GovernedPromptLookupDrafter(1, 3), 8),
        "block 8, n 1..12": (lambda: GovernedPromptLookupDrafter(1, 12), 8),
        "block 8, ungoverned": (lambda: GovernedPromptLookupDrafter(1, 3, adaptive=False), 8),
        f"grow 8..{n_max}, n 1..3 (now)": (lambda: GovernedPromptLookupDrafter(1, 3), n_max),
        f"grow 8..{n_max}, n 1..12": (lambda: GovernedPromptLookupDrafter(1, 12), n_max),
    }
    for extra in EXTRA_POLICIES:
        out.update(extra(n_max))
    out["oracle ceiling, block 8"] = (None, 8)
    out[f"oracle ceiling, block {n_max}"] = (None, n_max)
    return out


EXTRA_POLICIES: list = []  # filled by experiments


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--block", type=int, default=32, help="largest block (the server's --spec-ngram-simple-size-m)")
    ap.add_argument("--trace", default=None, help="print every round of the server's policy on this workload")
    ap.add_argument("--streams", default="/tmp/mlxcel-lookup-streams.json",
                    help="cache of the decoded streams (reused when present for the same settings)")
    args = ap.parse_args()

    from mlxcel.engine.model.loading import load_model

    loaded = load_model(None)
    cache_path = Path(args.streams)
    streams = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    key = str(args.max_tokens)
    streams.setdefault(key, {})
    for name, prompt in WORKLOADS.items():
        if streams[key].get(name, {}).get("prompt_text") != prompt:
            ids, out = decode_plain(loaded, prompt, args.max_tokens)
            streams[key][name] = {"prompt_text": prompt, "prompt": ids, "emitted": out}
    cache_path.write_text(json.dumps(streams))
    costs = forward_costs(loaded, 300, 33)
    print("forward cost vs width 1: " + " ".join(f"{w}:{costs[w - 1] / costs[0]:.2f}" for w in (1, 2, 4, 8, 12, 16, 24, 32)))
    tok = loaded.tokenizer

    if args.trace:
        s = streams[key][args.trace]
        make, n_max = policies(args.block)[f"grow 8..{args.block}, n 1..3 (now)"]

        def show(paused, tokens, out, acc):
            print(f"{'P' if paused else ' '} acc {acc}/{len(tokens)}  drafted {tok.decode(tokens)!r:50.50}  "
                  f"emitted {tok.decode(out)!r}")
        replay(make, n_max, s["prompt"], s["emitted"], trace=show)

    print("\n| workload | policy | tokens | forwards | tokens/forward | accepted/drafted | est. decode vs plain |")
    print("|---|---|---|---|---|---|---|")
    for name in WORKLOADS:
        s = streams[key][name]
        plain_time = costs[0] * (len(s["emitted"]) - 1)
        for label, (make, n_max) in policies(args.block).items():
            if make is None:
                r = replay_oracle(n_max, s["prompt"], s["emitted"])
            else:
                r = replay(make, n_max, s["prompt"], s["emitted"])
            t = sum(costs[min(w, len(costs)) - 1] for w in r["widths"])
            n = len(s["emitted"])
            print(f"| {name} | {label} | {n} | {len(r['widths'])} | {(n - 1) / max(len(r['widths']), 1):.2f} | "
                  f"{r['accepted']}/{r['drafted']} | {plain_time / t:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
