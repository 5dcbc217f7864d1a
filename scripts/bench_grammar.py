#!/usr/bin/env python
"""What a grammar costs: the token mask per decode step and per verify round, as a fraction of it.

Sections (``--sections``, comma-separated):

* ``engines``: the mask time per token of llguidance (the engine mlxcel uses) and, when installed,
  xgrammar, on the model's vocabulary, for a JSON schema, any JSON object and a GBNF grammar, one
  row and eight rows (llguidance's thread pool / xgrammar's batch matcher). The measurement the
  engine was chosen by.
* ``decode``: the server's batched decode step (``DecodeBatch``, 1 and 8 rows, each row under the
  same JSON schema, sampled at temperature 0.8) with and without the grammar, the two arms
  alternating step by step so a shared machine's load falls on both: step time, the time spent in
  the mask calls (``fill_masks`` + ``allowed_rows``, the forward running meanwhile), and the added
  step time as a fraction of the plain step.
* ``verify``: constrained speculative decoding (prompt lookup, and the model drafting for itself
  through ``DraftDraws``) on 1 and 8 rows (8 sessions round-robin, as the scheduler runs speculating
  rows): verify-round time and the share spent in the grammar (``admissible``, ``masks``,
  ``allowed_rows``, the drafter's masks included).

    ./scripts/with-blas .venv/bin/python scripts/bench_grammar.py [-m MODEL] [--sections ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import contextmanager

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "email", "tags", "address"]}
DOCUMENT = {"name": "Alice Liddell", "age": 42, "email": "alice@example.com",
            "tags": ["curious", "brave", "tea party regular", "chess"],
            "address": {"city": "Oxford", "zip": "OX1 1DP"}}
GBNF = ('root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\n'
        'factor ::= num | "(" expr ")"\nnum ::= [0-9]+')
GBNF_TEXT = "(12+7)*3-(45/9)+100*(2+(3*4))-7"
LONG_ARRAY = {"type": "array", "items": {"type": "string"}, "minItems": 500}  # cannot end within a run
DECODE_PROMPT = "List as many fruit names as you can, as a JSON array of strings."
REPEAT_PROMPT = "Repeat this JSON exactly, twice:\n" + json.dumps(DOCUMENT, indent=2)


def load(path):
    from mlxcel.engine.model.loading import load_model

    return load_model(path)


# -- engines -------------------------------------------------------------------------------------


def bench_engines(lm, rows_list):
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lln
    from llguidance.gbnf_to_lark import any_to_lark

    hf = lm.tokenizer._tokenizer
    enc = lambda text: hf.encode(text, add_special_tokens=False)  # noqa: E731
    cases = [("JSON schema", "json_schema", json.dumps(SCHEMA), enc(json.dumps(DOCUMENT))),
             ("any JSON object", "json_schema", json.dumps({"type": "object"}), enc(json.dumps(DOCUMENT))),
             ("GBNF arithmetic", "gbnf", GBNF, enc(GBNF_TEXT))]
    start = time.perf_counter()
    ll_tok = llguidance.hf.from_tokenizer(hf, n_vocab=lm.vocab_size, eos_token=sorted(lm.eos_token_ids))
    ll_build = time.perf_counter() - start
    executor = llguidance.LLExecutor()
    try:
        import xgrammar as xgr
        start = time.perf_counter()
        xg_info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=lm.vocab_size)
        xg_compiler = xgr.GrammarCompiler(xg_info)
        xg_build = time.perf_counter() - start
    except ImportError:
        xgr = None
    print(f"\n### Mask time per token ({lm.vocab_size}-token vocabulary)\n")
    print(f"tokenizer build: llguidance {ll_build:.2f} s" + (f", xgrammar {xg_build:.2f} s" if xgr else ""))
    print("\n| grammar | engine | rows | compile ms | mask µs per token (median) | mean | max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, kind, text, tokens in cases:
        for rows in rows_list:
            start = time.perf_counter()
            grammar = (llguidance.LLMatcher.grammar_from_json_schema(text) if kind == "json_schema"
                       else llguidance.LLMatcher.grammar_from_lark(any_to_lark(text)))
            matchers = [llguidance.LLMatcher(ll_tok, grammar) for _ in range(rows)]
            compile_ms = (time.perf_counter() - start) * 1e3 / rows
            mask = lln.allocate_token_bitmask(rows, ll_tok.vocab_size)
            times = []
            for t in tokens:
                start = time.perf_counter()
                lln.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], mask)
                times.append(time.perf_counter() - start)
                for m in matchers:
                    assert m.consume_token(t), m.get_error()
            print(f"| {label} | llguidance | {rows} | {compile_ms:.1f} | {statistics.median(times) * 1e6:.0f} | "
                  f"{statistics.mean(times) * 1e6:.0f} | {max(times) * 1e6:.0f} |", flush=True)
            if xgr is None:
                continue
            start = time.perf_counter()
            compiled = (xg_compiler.compile_json_schema(text) if kind == "json_schema"
                        else xg_compiler.compile_grammar(text))
            compile_ms = (time.perf_counter() - start) * 1e3
            xms = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
            xmask = xgr.allocate_token_bitmask(rows, lm.vocab_size)
            batch = xgr.BatchGrammarMatcher() if rows > 1 else None
            times = []
            for t in tokens:
                start = time.perf_counter()
                if batch is not None:
                    batch.batch_fill_next_token_bitmask(xms, xmask)
                else:
                    xms[0].fill_next_token_bitmask(xmask, 0)
                times.append(time.perf_counter() - start)
                for m in xms:
                    assert m.accept_token(t)
            print(f"| {label} | xgrammar | {rows} | {compile_ms:.1f} | {statistics.median(times) * 1e6:.0f} | "
                  f"{statistics.mean(times) * 1e6:.0f} | {max(times) * 1e6:.0f} |", flush=True)


# -- the batched decode step -----------------------------------------------------------------------


class DecodeRows:
    """``rows`` rows of the server's batched decode step, each prefilled with the prompt and sampled at
    temperature 0.8, constrained by ``grammar`` or not."""

    def __init__(self, lm, rows, grammar, seed):
        from mlxcel.engine.cache.batch import DecodeBatch
        from mlxcel.engine.cache.prefill import prefill
        from mlxcel.engine.sampling.chain import SamplerChain
        from mlxcel.engine.sampling.grammar_matcher import allowed_rows, new_matcher
        from mlxcel.engine.sampling.params import SamplerParams
        from mlxcel.server.cli.generate import encode_prompt

        self.lm, self.batch, self.seed = lm, DecodeBatch(lm.model), seed
        prompt = encode_prompt(lm, DECODE_PROMPT)
        self.chains, self.matchers, self.histories, self.last = [], [], [], []
        for r in range(rows):
            cache = lm.make_cache()
            logits = prefill(lm.model, prompt, cache)
            self.batch.add(r, cache)
            chain = SamplerChain(SamplerParams(temperature=0.8, seed=seed + r), vocab_size=lm.vocab_size,
                                 eos_token_ids=lm.eos_token_ids)
            m = new_matcher(grammar, lm.tokenizer, lm.vocab_size, lm.eos_token_ids) if grammar else None
            allowed = allowed_rows(m.masks(), lm.vocab_size) if m else None
            token = chain.select(logits[None], prompt, seed=seed + r, first_position=len(prompt), allowed=allowed)[0]
            if m:
                m.advance([token])
            self.chains.append(chain), self.matchers.append(m)
            self.histories.append(prompt + [token]), self.last.append(token)

    def step(self) -> tuple[float, float]:
        """One step as the scheduler runs it: (step seconds, seconds in the mask calls)."""
        import mlx.core as mx

        from mlxcel.engine.sampling.grammar_matcher import allowed_rows, fill_masks

        start = time.perf_counter()
        logits = self.batch.queue_step(self.last)
        masks, spent = {}, 0.0
        if self.matchers[0] is not None:
            t0 = time.perf_counter()
            packed = fill_masks([(m, ()) for m in self.matchers])
            masks = {j: allowed_rows(p, self.lm.vocab_size) for j, p in enumerate(packed)}
            spent = time.perf_counter() - t0
        mx.eval(logits)
        for j, chain in enumerate(self.chains):
            h = self.histories[j]
            token = chain.select(logits[j][None], h, seed=self.seed + j, first_position=len(h), allowed=masks.get(j))[0]
            if self.matchers[j] is not None:
                self.matchers[j].advance([token])
            h.append(token)
            self.last[j] = token
        return time.perf_counter() - start, spent


def bench_decode(lm, rows_list, steps, repeats):
    from mlxcel.engine.sampling.grammar import JSON_SCHEMA, compile_grammar

    grammar = compile_grammar(JSON_SCHEMA, LONG_ARRAY)
    print(f"\n### Batched decode step, {steps} steps x {repeats}, temperature 0.8, the two arms alternating step "
          "by step (medians)\n")
    print("| rows | plain step ms | constrained step ms | mask calls ms | mask calls / plain step | "
          "added step time |")
    print("|---:|---:|---:|---:|---:|---:|")
    for rows in rows_list:
        plain, cons, mask = [], [], []
        for rep in range(repeats):
            a, b = DecodeRows(lm, rows, None, 100 * rep), DecodeRows(lm, rows, grammar, 100 * rep)
            for i in range(steps + 2):
                p = a.step()[0]
                c, m = b.step()
                if i >= 2:  # the first steps warm the caches up
                    plain.append(p), cons.append(c), mask.append(m)
        p, c, m = (statistics.median(x) for x in (plain, cons, mask))
        print(f"| {rows} | {p * 1e3:.1f} | {c * 1e3:.1f} | {m * 1e3:.2f} | {m / p:.2%} | {(c - p) / p:+.1%} |",
              flush=True)


# -- verify rounds --------------------------------------------------------------------------------


@contextmanager
def grammar_clock():
    """Time every grammar call a verify round (and a drafter) makes."""
    from mlxcel.drafters import draws
    from mlxcel.engine.sampling import grammar_matcher
    from mlxcel.engine.speculative import verify

    spent = [0.0]
    patched = []

    def timed(owner, name):
        real = getattr(owner, name)

        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                spent[0] += time.perf_counter() - start
        setattr(owner, name, wrapper)
        patched.append((owner, name, real))

    for owner, name in ((grammar_matcher.GrammarMatcher, "admissible"), (grammar_matcher.GrammarMatcher, "masks"),
                        (verify, "allowed_rows"), (draws, "allowed_rows")):
        timed(owner, name)
    try:
        yield spent
    finally:
        for owner, name, real in patched:
            setattr(owner, name, real)


def bench_verify(lm, rows_list, tokens, k):
    from mlxcel.drafters.draft_model import DraftModelDrafter
    from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
    from mlxcel.engine.decode.speculative import speculative_generate
    from mlxcel.engine.sampling.grammar import JSON_SCHEMA, compile_grammar
    from mlxcel.engine.sampling.grammar_matcher import new_matcher
    from mlxcel.engine.sampling.params import SamplerParams
    from mlxcel.engine.speculative.session import SpeculativeSession
    from mlxcel.server.cli.generate import encode_prompt

    grammar = compile_grammar(JSON_SCHEMA, {"type": "array", "items": SCHEMA, "minItems": 2})
    prompt = encode_prompt(lm, REPEAT_PROMPT)
    print(f"\n### Verify rounds, {tokens} tokens per row, K = {k}, temperature 0\n")
    print("| drafter | rows | rounds | round ms | grammar ms per round | grammar / round | accepted per round |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, make in (("prompt lookup", PromptLookupDrafter), ("draft model (itself)", lambda: DraftModelDrafter(lm))):
        for rows in rows_list:
            sessions = [SpeculativeSession(make(), SamplerParams(temperature=0.0), n_max=k,
                                           grammar=new_matcher(grammar, lm.tokenizer, lm.vocab_size,
                                                               lm.eos_token_ids)) for _ in range(rows)]
            with grammar_clock() as spent:
                runs = [speculative_generate(lm, s, prompt, max_tokens=tokens) for s in sessions]
                for r in runs:
                    next(r)  # each row's prefill and first token, outside the timed rounds
                live, start, spent[0] = list(runs), time.perf_counter(), 0.0
                while live:  # round-robin, one round per row per tick, as the scheduler runs them
                    for r in list(live):
                        if next(r, None) is None:
                            live.remove(r)
                elapsed = time.perf_counter() - start
            rounds = sum(s.counters.rounds + s.counters.plain_steps for s in sessions)
            accepted = sum(s.counters.accepted for s in sessions) / max(1, rounds)
            print(f"| {name} | {rows} | {rounds} | {elapsed / rounds * 1e3:.1f} | {spent[0] / rounds * 1e3:.2f} | "
                  f"{spent[0] / elapsed:.1%} | {accepted:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="model (default: the built-in SmolLM2)")
    ap.add_argument("--sections", default="engines,decode,verify")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--steps", type=int, default=40, help="decode steps per run")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96, help="tokens per row in the verify section")
    ap.add_argument("-k", type=int, default=6, help="drafts per verify round")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    lm = load(args.model)
    print(f"model {lm.name}, load average {os.getloadavg()[0]:.2f}")
    sections = args.sections.split(",")
    if "engines" in sections:
        bench_engines(lm, rows)
    if "decode" in sections:
        bench_decode(lm, rows, args.steps, args.repeats)
    if "verify" in sections:
        bench_verify(lm, rows, args.tokens, args.k)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
