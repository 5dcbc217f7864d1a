#!/usr/bin/env python
"""Repeated chat traffic: the same conversation of ``--turns`` chat turns sent twice to each server, and
the second pass's decode speed against the first.

What it measures is what an n-gram drafter that outlives a request buys: ``--spec-type ngram-cache``
keeps, per slot, the n-gram statistics of everything the slot has read and generated, so the second
time a turn comes (an agent re-running a step, a user regenerating, a client retrying) its answer is
drafted from the first time's. Arms, one server each, ``-np 1`` (one slot sees the whole traffic):

* ``plain``: no speculation (its pass-2 / pass-1 ratio is the control: prompt caching and machine drift);
* ``ngram-simple``: prompt lookup, which searches only the request's own prompt and output;
* ``ngram-cache``: upstream's n-gram cache, each slot's kept across its requests.

The conversation: a system prompt, then ``--turns`` user messages, each request carrying the
conversation so far (the answers the server gave, so every arm sees its own, which are the same at
temperature 0). Greedy, ``--max-tokens`` per answer. The arms take turns request by request, so a
change in the machine's load hits them alike. Reported per arm and pass: decode tokens/s (the
responses' ``predicted_n`` over their ``predicted_ms``, summed over the pass), tokens per target
forward (``(n - 1) / (n - 1 - accepted)``), accepted / drafted; then pass 2 / pass 1. The outputs of
every arm are checked equal to plain's.

    ./scripts/with-blas .venv/bin/python scripts/bench_repeated_turns.py [--turns 20] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "helpers"))
from server_process import ServerProcess  # noqa: E402

SYSTEM = "You are a concise assistant. Answer in two or three sentences."
QUESTIONS = [
    "What is a hash table?", "How does a hash table handle collisions?", "What is a binary search tree?",
    "When is a linked list better than an array?", "What does a compiler do?", "What is garbage collection?",
    "Explain recursion with an example.", "What is the difference between a process and a thread?",
    "What is a deadlock?", "How does HTTPS keep a connection private?", "What is a database index?",
    "What is the CAP theorem?", "What does a load balancer do?", "What is caching and why does it help?",
    "What is a unit test?", "What is version control?", "What is a REST API?", "What is JSON?",
    "What is a race condition?", "Summarise what we talked about in one sentence.",
]
ARMS = {"plain": (), "ngram-simple": ("--spec-type", "ngram-simple"), "ngram-cache": ("--spec-type", "ngram-cache")}
CLIENT = httpx.Client(timeout=600)


def ask(url: str, messages: list[dict], max_tokens: int) -> dict:
    r = CLIENT.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens,
                                                        "temperature": 0})
    r.raise_for_status()
    body = r.json()
    t = body["timings"]
    return {"text": body["choices"][0]["message"]["content"], "n": t["predicted_n"], "ms": t["predicted_ms"],
            "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}


def run(urls: dict[str, str], turns: int, max_tokens: int) -> dict[tuple[str, int], list[dict]]:
    """Both passes; per (arm, pass) the responses in turn order."""
    results: dict[tuple[str, int], list[dict]] = {}
    for rep in (1, 2):
        history = {arm: [{"role": "system", "content": SYSTEM}] for arm in urls}
        for i in range(turns):
            order = list(urls) if (i + rep) % 2 == 0 else list(urls)[::-1]
            for arm in order:
                history[arm].append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
                r = ask(urls[arm], history[arm], max_tokens)
                history[arm].append({"role": "assistant", "content": r["text"]})
                results.setdefault((arm, rep), []).append(r)
            print(f"  pass {rep} turn {i + 1:2d} " + "  ".join(
                f"{arm} {results[(arm, rep)][-1]['accepted']}/{results[(arm, rep)][-1]['drafted']}" for arm in urls),
                file=sys.stderr)
    return results


def summary(rs: list[dict]) -> dict:
    n = sum(r["n"] for r in rs)
    accepted = sum(r["accepted"] for r in rs)
    steps = sum(max(r["n"] - 1 - r["accepted"], 1) for r in rs)
    return {"tps": n / (sum(r["ms"] for r in rs) / 1000), "tpf": sum(r["n"] - 1 for r in rs) / steps,
            "accepted": accepted, "drafted": sum(r["drafted"] for r in rs), "n": n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("-m", "--model", default=None, help="the model (default: the built-in SmolLM2-135M-Instruct)")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ",".join(ARMS))
    args = ap.parse_args()
    os.environ.setdefault("MLXCEL_LOG", "warning")
    model = ["-m", args.model] if args.model else []
    arms = [a for a in args.arms.split(",") if a]
    servers = {}
    try:
        for arm in arms:
            servers[arm] = ServerProcess(*model, "-c", "8192", "-np", "1", *ARMS[arm], timeout=600)
        urls = {arm: s.url for arm, s in servers.items()}
        for url in urls.values():
            ask(url, [{"role": "user", "content": "Hello"}], 4)  # warm each server (and its slot) alike
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        results = run(urls, args.turns, args.max_tokens)
        wall = time.perf_counter() - t0
    finally:
        for s in servers.values():
            s.stop()
    base = "plain" if "plain" in arms else arms[0]
    for arm in arms:
        for rep in (1, 2):
            texts = [r["text"] for r in results[(arm, rep)]]
            assert texts == [r["text"] for r in results[(base, rep)]], f"{arm} pass {rep}: output differs"
    print(f"{Path(args.model).name if args.model else 'SmolLM2-135M-Instruct'}, greedy, {args.turns} chat turns "
          f"sent twice, {args.max_tokens} tokens an answer, -np 1; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after, {wall:.0f} s. Outputs identical across arms.\n")
    print("| arm | pass 1 decode tok/s | pass 2 decode tok/s | pass 2 / pass 1 | tokens/forward 1 -> 2 "
          "| accepted/drafted 1 | accepted/drafted 2 |")
    print("|---|---|---|---|---|---|---|")
    for arm in arms:
        one, two = summary(results[(arm, 1)]), summary(results[(arm, 2)])
        print(f"| {arm} | {one['tps']:.1f} | {two['tps']:.1f} | {two['tps'] / one['tps']:.2f}x "
              f"| {one['tpf']:.2f} -> {two['tpf']:.2f} | {one['accepted']}/{one['drafted']} "
              f"| {two['accepted']}/{two['drafted']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
