"""A real GGUF file through mlxcel and through llama-server, side by side.

    .venv/bin/python scripts/compare_gguf_llama_server.py --llama-server PATH/llama-server \
        MODEL.gguf [MODEL.gguf ...] [--out docs/data/gguf-vs-llama-server.json]

For each file:

1. ``/tokenize`` on llama-server (``add_special`` off and on, special tokens parsed) for a battery
   of texts (unicode, whitespace runs, digits, code, special-token markup) against mlxcel's
   ``/tokenize`` code path (``prompts.tokenize_text`` + ``bos_prefix``) on the same file;
2. greedy continuations of five prompts, 16 tokens, from llama-server ``/completion``
   (``temperature: 0``, ``n_probs: 5``) against mlxcel's model on llama-server's own prompt ids.
   Where the two first differ, both logit margins between the two candidate tokens are reported
   (ours from our logits, llama-server's from its log-probabilities, which differ by the same
   amount), with the largest disagreement of the two implementations' log-probabilities at the
   positions before it: a divergence is explained when its margin is below that disagreement
   (llama.cpp's CPU kernels round activations to 8 bits; mlxcel runs the exact float32 values
   of the quantized weights).

Writes one JSON record per file (``--out``) and prints a summary. llama-server runs with one
thread and one slot; load average matters little here (no timings are compared).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]

TEXTS = [
    "Hello world",
    " Hello World!",
    "The capital of France is Paris.",
    "Ünïcödé — naïve café, 東京タワー, Ελληνικά, русский, हिन्दी, 한국어, emoji 🚀🤗🦙",
    "   leading spaces and trailing   ",
    "tabs\tand\t\tnewlines\n\n\nthree\n",
    "multiple     spaces      here",
    "3.14159 2024-06-01 1234567890 007 1,000,000",
    "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))  # -> 3\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    "I'm sure they'll say it's John's, we've done it.",
    "<|im_start|>user\nWhat's up?<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhey<|eot_id|>",
    "<s>[INST] hello [/INST]</s>",
    "",
    " ",
    "\n",
]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "Q: What is 17 * 23?\nA:",
    "The three primary colors are",
]
N_PREDICT = 16


def start_llama_server(binary: str, model: Path, port: int) -> subprocess.Popen:
    log = open(Path("/tmp") / f"llama-server-{port}.log", "wb")
    proc = subprocess.Popen([binary, "-m", str(model), "-c", "2048", "-np", "1", "-t", "1", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}; see /tmp/llama-server-{port}.log")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy")


def upstream(binary: str, model: Path, port: int) -> dict:
    """Everything asked of llama-server for one file."""
    proc = start_llama_server(binary, model, port)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=600) as c:
            tokens = {}
            for add_special in (False, True):
                tokens[str(add_special)] = [
                    c.post("/tokenize", json={"content": t, "add_special": add_special}).json()["tokens"] for t in TEXTS]
            completions = []
            for prompt in PROMPTS:
                ids = c.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
                r = c.post("/completion", json={"prompt": ids, "n_predict": N_PREDICT, "temperature": 0,
                                                "n_probs": 5, "cache_prompt": False}).json()
                steps = [{"token": p["id"], "top": [(t["id"], t["logprob"]) for t in p["top_logprobs"]]}
                         for p in r["completion_probabilities"]]
                completions.append({"prompt": prompt, "prompt_ids": ids, "steps": steps})
    finally:
        proc.terminate()
        proc.wait(30)
    return {"tokens": tokens, "completions": completions}


def ours(model: Path, up: dict) -> dict:
    """The same questions asked of mlxcel, with llama-server's answers to compare against."""
    sys.path.insert(0, str(REPO))
    import mlx.core as mx

    from mlxcel.engine.model.loading import load_model
    from mlxcel.server.http.prompts import bos_prefix, tokenize_text

    start = time.perf_counter()
    loaded = load_model(model)
    load_s = time.perf_counter() - start
    token_cases = []
    for add_special in (False, True):
        for text, theirs in zip(TEXTS, up["tokens"][str(add_special)]):
            mine = tokenize_text(loaded.tokenizer, text, add_special=False)
            if add_special:
                mine = bos_prefix(loaded) + mine
            token_cases.append({"text": text, "add_special": add_special, "ok": mine == theirs,
                                "ours": mine, "llama_server": theirs})
    completions = []
    for case in up["completions"]:
        ids = list(case["prompt_ids"])
        cache = loaded.make_cache()
        logits = loaded.model(mx.array([ids]), cache=cache)[0, -1].astype(mx.float32)
        agree, first_diff, disagreement = 0, None, 0.0
        for step in case["steps"]:
            logprobs = logits - mx.logsumexp(logits)
            mine = int(mx.argmax(logits).item())
            if first_diff is None:
                theirs = step["token"]
                if mine != theirs:
                    top = dict(step["top"])
                    first_diff = {
                        "position": agree, "ours": mine, "llama_server": theirs,
                        "ours_piece": loaded.tokenizer.decode([mine]), "llama_server_piece": loaded.tokenizer.decode([theirs]),
                        "our_margin": float(logits[mine].item() - logits[theirs].item()),
                        "llama_server_margin": (float(top[theirs] - top[mine]) if mine in top else None),
                    }
                    break
                for tid, lp in step["top"]:
                    disagreement = max(disagreement, abs(float(logprobs[tid].item()) - lp))
                agree += 1
            logits = loaded.model(mx.array([[step["token"]]]), cache=cache)[0, -1].astype(mx.float32)
        if first_diff is not None:
            first_diff["explained"] = first_diff["our_margin"] <= max(disagreement, 1e-3) * 2
        completions.append({"prompt": case["prompt"], "prompt_ids": ids,
                            "llama_server_tokens": [s["token"] for s in case["steps"]],
                            "agree": agree, "of": len(case["steps"]),
                            "max_logprob_disagreement": disagreement, "first_divergence": first_diff,
                            "text": loaded.tokenizer.decode([s["token"] for s in case["steps"]])})
    return {"architecture": loaded.metadata["architecture"], "model_type": loaded.config["model_type"],
            "tokenizer_pre": loaded.metadata.get("tokenizer_pre"), "load_s": round(load_s, 1),
            "weight_mib": round(loaded.metadata.get("weight_bytes", 0) / 2**20, 1),
            "tokenize": token_cases, "greedy": completions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--port", type=int, default=18190)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "data" / "gguf-vs-llama-server.json")
    args = ap.parse_args()
    records = json.loads(args.out.read_text()) if args.out.exists() else {}
    for model in args.models:
        print(f"== {model.name}", flush=True)
        up = upstream(args.llama_server, model, args.port)
        rec = ours(model, up)
        records[model.name] = rec
        ok = sum(c["ok"] for c in rec["tokenize"])
        print(f"  {rec['architecture']} -> {rec['model_type']}, pre {rec['tokenizer_pre']}: /tokenize {ok}/{len(rec['tokenize'])} equal")
        for c in rec["tokenize"]:
            if not c["ok"]:
                print(f"    differs: {c['text']!r} add_special={c['add_special']}: ours {c['ours']} vs {c['llama_server']}")
        for g in rec["greedy"]:
            d = g["first_divergence"]
            tail = "" if d is None else (f"; first divergence at {d['position']}: ours {d['ours_piece']!r} vs "
                                         f"{d['llama_server_piece']!r}, margins {d['our_margin']:.3f} (ours) / "
                                         f"{d['llama_server_margin']} (llama-server), max logprob disagreement before "
                                         f"{g['max_logprob_disagreement']:.3f}, explained={d['explained']}")
            print(f"  greedy {g['prompt'][:30]!r}: {g['agree']}/{g['of']} agree{tail}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
