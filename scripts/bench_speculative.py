#!/usr/bin/env python
"""Measure speculative decoding: acceptance against the closed forms, end-to-end speed against
plain decoding in the same run, prompt lookup, and how often seed invariance is broken by
float differences between a block forward and a one-token forward.

Sections (pick with --sections, comma-separated):

* ``acceptance``: target + draft model, for each --temps value, both rules (sampler-match and
  the opt-in stochastic rule) with the diagnostic on: per_position_acceptance, the two closed
  forms, mean accepted length.
* ``speed``: plain decode vs speculative decode, tokens/s and the ratio, at temperature 0 and
  at the first --temps value. Best of --repeats.
* ``lookup``: prompt lookup on --lookup-model (default: the built-in SmolLM2) for prompts that
  repeat or edit text, tokens/s vs plain decode and the acceptance line.
* ``seeds``: for --seed-runs seeds, sampler-match tokens vs plain tokens under the same seed;
  reports how many runs diverge and where.

Example (the numbers in docs/speculative-acceptance.md):

    ./scripts/with-blas .venv/bin/python scripts/bench_speculative.py \
        --target models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --draft models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf -n 64
"""

from __future__ import annotations

import argparse
import sys
import time

from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.report import report_lines
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.server.cli.generate import encode_prompt

CODE_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring and tests."
LOOKUP_PROMPTS = {
    "repeat": "Repeat the following text exactly, word for word:\n\n"
              "The committee met on Tuesday to review the budget. After a long discussion, the members agreed "
              "to postpone the vote until the next meeting, when the final figures from the finance office "
              "would be available.",
    "edit": "Rewrite this code with the variable `x` renamed to `total`, changing nothing else:\n\n"
            "def f(items):\n    x = 0\n    for item in items:\n        x += item.price * item.count\n"
            "    if x > 100:\n        x = x * 0.9\n    return x\n",
}


def params_for(temp: float, seed: int) -> SamplerParams:
    return SamplerParams(temperature=temp, seed=seed)


def plain(model, prompt, params, n):
    chain = SamplerChain(params, vocab_size=model.vocab_size, eos_token_ids=model.eos_token_ids,
                         tokenizer=model.tokenizer)
    start = time.perf_counter()
    steps = list(generate_tokens(model.model, prompt, chain, cache=model.make_cache(), max_tokens=n, seed=params.seed))
    return [s.token for s in steps], len(steps) / (time.perf_counter() - start), steps[-1].generation_tps


def speculative(model, drafter, prompt, params, n, k, *, stochastic=None, diagnostics=False):
    session = SpeculativeSession(drafter, params, n_max=k, stochastic=stochastic, diagnostics=diagnostics)
    counters = session.counters
    start = time.perf_counter()
    steps = list(speculative_generate(model, session, prompt, max_tokens=n))
    tokens = [t for s in steps for t in s.tokens]
    return tokens, len(tokens) / (time.perf_counter() - start), steps[-1].generation_tps, counters


def section_acceptance(args, target, draft, prompt):
    print(f"\n## Acceptance (target {target.name}, drafter {draft.name}, K={args.k}, n={args.n}, seed={args.seed})")
    print("| temp | rule | per_position_acceptance | closed_form_sum_min | closed_form_sum_prod | mean_accepted_len |")
    print("|---|---|---|---|---|---|")
    for temp in args.temps:
        for stochastic in (False, True):
            drafter = DraftModelDrafter(draft, target_vocab_size=target.vocab_size)
            _, _, _, c = speculative(target, drafter, prompt, params_for(temp, args.seed), args.n, args.k,
                                     stochastic=stochastic, diagnostics=True)
            print(f"| {temp} | {c.rule} | {c.per_position_acceptance:.4f} | {c.closed_form_sum_min:.4f} | "
                  f"{c.closed_form_sum_prod:.4f} | {c.mean_accepted_len:.4f} |", flush=True)


def section_speed(args, target, draft, prompt):
    print(f"\n## Speed (best of {args.repeats}; decode tokens/s, prefill excluded)")
    print("| temp | rule | plain tok/s | speculative tok/s | ratio | mean_accepted_len | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for temp in (0.0, args.temps[0]):
        params = params_for(temp, args.seed)
        best_plain = best_spec = 0.0
        for _ in range(args.repeats):
            ref, _, tps = plain(target, prompt, params, args.n)
            best_plain = max(best_plain, tps)
            drafter = DraftModelDrafter(draft, target_vocab_size=target.vocab_size)
            got, _, stps, c = speculative(target, drafter, prompt, params, args.n, args.k)
            best_spec = max(best_spec, stps)
        print(f"| {temp} | {c.rule} | {best_plain:.2f} | {best_spec:.2f} | {best_spec / best_plain:.2f}x | "
              f"{c.mean_accepted_len:.2f} | {got == ref} |", flush=True)


def section_lookup(args):
    model = load_model(args.lookup_model)
    print(f"\n## Prompt lookup ({model.name}, temp 0, n={args.lookup_n}, K={args.k}, best of {args.repeats})")
    print("| prompt | plain tok/s | lookup tok/s | ratio | same tokens | report |")
    print("|---|---|---|---|---|---|")
    for name, text in LOOKUP_PROMPTS.items():
        prompt = encode_prompt(model, text)
        params = params_for(0.0, args.seed)
        best_plain = best_spec = 0.0
        for _ in range(args.repeats):
            ref, _, tps = plain(model, prompt, params, args.lookup_n)
            best_plain = max(best_plain, tps)
            drafter = PromptLookupDrafter(args.lookup_min, args.lookup_max)
            got, _, stps, c = speculative(model, drafter, prompt, params, args.lookup_n, args.k)
            best_spec = max(best_spec, stps)
        lines = report_lines(c, diagnostics=False, drafter=drafter)
        summary = (f"ppa={c.per_position_acceptance:.2f} mal={c.mean_accepted_len:.2f} rounds={c.rounds} "
                   f"pauses={drafter.counters.pauses}")
        print(f"| {name} | {best_plain:.1f} | {best_spec:.1f} | {best_spec / best_plain:.2f}x | {got == ref} | "
              f"{summary} |", flush=True)
        if args.verbose:
            print("\n".join(lines))


def section_seeds(args, target, draft, prompt):
    print(f"\n## Seed invariance (sampler-match vs plain, {args.seed_runs} seeds, n={args.n})")
    print("| temp | runs | identical | first divergence positions |")
    print("|---|---|---|---|")
    for temp in args.temps[:2]:
        same, where = 0, []
        for seed in range(args.seed_runs):
            params = params_for(temp, 1000 + seed)
            ref, _, _ = plain(target, prompt, params, args.n)
            drafter = DraftModelDrafter(draft, target_vocab_size=target.vocab_size)
            got, _, _, _ = speculative(target, drafter, prompt, params, args.n, args.k)
            if got == ref:
                same += 1
            else:
                where.append(next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b))
        print(f"| {temp} | {args.seed_runs} | {same} | {where or '-'} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--prompt", default=CODE_PROMPT)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--temps", type=lambda s: [float(x) for x in s.split(",")], default=[0.7, 1.0, 1.5])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--sections", default="acceptance,speed,lookup")
    ap.add_argument("--lookup-model", default=None, help="default: the built-in SmolLM2")
    ap.add_argument("--lookup-n", type=int, default=128)
    ap.add_argument("--lookup-min", type=int, default=1)
    ap.add_argument("--lookup-max", type=int, default=3)
    ap.add_argument("--seed-runs", type=int, default=20)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))

    if sections & {"acceptance", "speed", "seeds"}:
        if not (args.target and args.draft):
            ap.error("--target and --draft are needed for the acceptance, speed and seeds sections")
        target, draft = load_model(args.target), load_model(args.draft)
        prompt = encode_prompt(target, args.prompt)
        print(f"prompt: {len(prompt)} tokens", file=sys.stderr)
        if "acceptance" in sections:
            section_acceptance(args, target, draft, prompt)
        if "speed" in sections:
            section_speed(args, target, draft, prompt)
        if "seeds" in sections:
            section_seeds(args, target, draft, prompt)
    if "lookup" in sections:
        section_lookup(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
