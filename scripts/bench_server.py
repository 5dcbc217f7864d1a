#!/usr/bin/env python
"""Server throughput: mlxcel-server vs mlx_lm.server on the same weights, in the same run.

Both servers load the same MLX directory (the built-in SmolLM2-135M-Instruct, dequantized to float32
and exported once), both with OpenBLAS preloaded. For 1, 4 and 8 concurrent clients, every client
streams one /v1/chat/completions request (greedy, ``--max-tokens`` tokens) with its own prompt; we report
aggregate generated tokens/s over the wall time of the round and the mean time to first token.
The ratio column is mlxcel / mlx_lm at the same concurrency.

    ./scripts/with-blas .venv/bin/python scripts/bench_server.py [--max-tokens 64] [--clients 1,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from mlxcel.engine.platform.device import env_with_fast_blas

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a rainbow forms, step by step.",
    "List ten ideas for a weekend trip and describe each one.",
    "Describe the history of the printing press in detail.",
    "Write a poem about the sea at night.",
    "Explain the rules of chess to a beginner.",
    "Describe a day in the life of a medieval blacksmith.",
    "Write a letter to a friend about your favourite book.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def export_default_model(out: Path) -> Path:
    """The built-in model as an MLX directory of float32 weights (what mlx_lm.server can load)."""
    if (out / "config.json").exists():
        return out
    from mlx_lm.utils import save_config, save_model

    from mlxcel.engine.model.loading import load_model

    loaded = load_model(None)
    save_model(out, loaded.model)
    config = dict(loaded.config)
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    save_config(config, out / "config.json")
    tok = getattr(loaded.tokenizer, "_tokenizer", loaded.tokenizer)
    tok.save_pretrained(str(out))
    if loaded.chat_template and not (out / "chat_template.jinja").exists():
        (out / "chat_template.jinja").write_text(loaded.chat_template)
    return out


def start(cmd: list[str], url: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env_with_fast_blas(), stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited: {log.read_text()[-2000:]}")
        try:
            r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0},
                           timeout=60)
            if r.status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd} did not come up")


async def one_client(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, model: str):
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                tokens += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    return tokens, ttft if ttft is not None else float("nan")


async def round_(url: str, clients: int, max_tokens: int, model: str):
    async with httpx.AsyncClient() as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one_client(client, url, PROMPTS[i % len(PROMPTS)], max_tokens, model)
                                         for i in range(clients)))
        wall = time.perf_counter() - t0
    tokens = sum(t for t, _ in results)
    ttfts = [f for _, f in results if f == f]
    return tokens / wall, sum(ttfts) / max(len(ttfts), 1), tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "mlxcel-bench" / "smollm2-135m-f32"))
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    model_dir = export_default_model(Path(args.model_dir))
    logs = Path(tempfile.mkdtemp(prefix="bench-server-"))
    servers = {
        "mlxcel": lambda port: [sys.executable, "-m", "mlxcel.server.cli", "-m", str(model_dir),
                                "--port", str(port), "-np", str(max(levels)), "-c", "2048"],
        "mlx_lm": lambda port: [sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), "--port",
                                str(port), "--temp", "0", "--max-tokens", str(args.max_tokens)],
    }
    table: dict[str, dict[int, tuple[float, float, int]]] = {}
    for name, cmd in servers.items():
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start(cmd(port), url, logs / f"{name}.log")
        try:
            asyncio.run(round_(url, 1, 8, str(model_dir)))  # warm-up
            table[name] = {}
            for c in levels:
                table[name][c] = asyncio.run(round_(url, c, args.max_tokens, str(model_dir)))
                tps, ttft, n = table[name][c]
                print(f"{name:7s} clients={c}: {tps:7.1f} tok/s aggregate, TTFT {ttft * 1e3:7.0f} ms ({n} tokens)",
                      flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print()
    print("| clients | mlxcel tok/s | mlx_lm tok/s | ratio | mlxcel TTFT ms | mlx_lm TTFT ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c in levels:
        a, b = table["mlxcel"][c], table["mlx_lm"][c]
        print(f"| {c} | {a[0]:.1f} | {b[0]:.1f} | {a[0] / b[0]:.2f}x | {a[1] * 1e3:.0f} | {b[1] * 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
