#!/usr/bin/env python
"""Server throughput: mlxcel-server vs mlx_lm.server on the same weights, in the same run.

Both servers load the same MLX directory (the built-in SmolLM2-135M-Instruct, dequantized to float32
and exported once), both with OpenBLAS preloaded. For 1, 4 and 8 concurrent clients, every client
streams one /v1/chat/completions request (greedy, ``--max-tokens`` tokens) with its own prompt; we report
aggregate generated tokens/s over the wall time of the round and the mean time to first token.
The ratio column is mlxcel / mlx_lm at the same concurrency.

    ./scripts/with-blas .venv/bin/python scripts/bench_server.py [--max-tokens 64] [--clients 1,4,8] [--bits 4]

``--bits 4`` (or 8): both servers load that export affine-quantized by mlx-lm's own ``quantize_model``
(group 64), the weights a user of mlx_lm.server would run; mlxcel runs them on its packed CPU
kernels, mlx_lm on MLX's quantized matmul.

``--unified-ab``: instead, two mlxcel servers on the same model (``-m``, default the built-in
SmolLM2 GGUF, packed CPU kernels), one with the iteration's single ragged forward (prompt chunks,
plain rows and verify blocks together, the default) and one with ``MLXCEL_UNIFIED_STEP=0`` (each
prompt chunk its own forward, plain rows in mlx-lm's batch cache): ``--clients`` clients arriving
together, ``--repeats`` rounds with the arms alternating, reporting per arm the median aggregate
tok/s, the median of the rounds' mean time to first token and the server process's CPU seconds.

    ./scripts/with-blas .venv/bin/python scripts/bench_server.py --unified-ab [--clients 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
    from mlxcel.engine.platform import settings

    # float32 weights to export, neither the CPU kernels' packed blocks nor their float32 tiles, nor
    # the MLX-native profile's float16 (when the run sets MLXCEL_KERNELS=mlx)
    with settings.switched(weights="float32", float_kernel=False, dtype="float32"):
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


def quantized_copy(src: Path, bits: int) -> Path:
    """``src`` (an MLX directory) affine-quantized to ``bits`` by mlx-lm, next to it; made once."""
    out = src.with_name(f"{src.name}-q{bits}")
    if (out / "config.json").exists():
        return out
    import shutil

    from mlx_lm.utils import load, quantize_model, save_config, save_model

    model, _ = load(str(src))
    config = json.loads((src / "config.json").read_text())
    model, config = quantize_model(model, config, group_size=64, bits=bits)
    save_model(out, model)
    save_config(config, out / "config.json")
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, out / f.name)
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
    ap.add_argument("--unified-ab", action="store_true", help="one ragged forward per iteration vs not (docstring)")
    ap.add_argument("-m", "--model", default=None, help="--unified-ab: the model (default the built-in SmolLM2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bits", type=int, default=0, choices=(0, 4, 8), help="affine-quantize the export (docstring)")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    if args.unified_ab:
        return unified_ab(args, max(levels))
    model_dir = export_default_model(Path(args.model_dir))
    if args.bits:
        model_dir = quantized_copy(model_dir, args.bits)
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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def unified_ab(args, clients: int) -> int:
    import statistics

    logs = Path(tempfile.mkdtemp(prefix="bench-server-ab-"))
    model = ["-m", args.model] if args.model else []
    arms = {"unified": "1", "separate": "0"}
    procs, urls = {}, {}
    try:
        for name, flag in arms.items():
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "mlxcel.server.cli", *model, "--port", str(port), "-np", str(clients),
                   "-c", str(2048 * clients)]
            env = {**env_with_fast_blas(), "MLXCEL_UNIFIED_STEP": flag}
            procs[name] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(logs / f"{name}.log", "wb"),
                                           stderr=subprocess.STDOUT)
            start_wait(procs[name], urls[name], logs / f"{name}.log")
            asyncio.run(round_(urls[name], clients, 8, "m"))  # warm-up
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in arms}
        for r in range(args.repeats):
            for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                cpu0 = cpu_seconds(procs[name].pid)
                tps, ttft, n = asyncio.run(round_(urls[name], clients, args.max_tokens, "m"))
                results[name].append((tps, ttft, cpu_seconds(procs[name].pid) - cpu0))
                print(f"{name:8s} round {r}: {tps:7.1f} tok/s, TTFT {ttft * 1e3:6.0f} ms ({n} tokens)", flush=True)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
    med = {name: [statistics.median(x[i] for x in rows) for i in range(3)] for name, rows in results.items()}
    print()
    print(f"| {clients} clients together | aggregate tok/s | mean TTFT ms | server CPU s |")
    print("|---|---:|---:|---:|")
    for name in arms:
        tps, ttft, cpu = med[name]
        print(f"| {name} | {tps:.1f} | {ttft * 1e3:.0f} | {cpu:.1f} |")
    u, s_ = med["unified"], med["separate"]
    print(f"| unified / separate | {u[0] / s_[0]:.2f}x | {u[1] / s_[1]:.2f}x | {u[2] / s_[2]:.2f}x |")
    return 0


def start_wait(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not come up")


if __name__ == "__main__":
    sys.exit(main())
