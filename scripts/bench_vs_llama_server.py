#!/usr/bin/env python
"""Decode speed side by side: mlxcel-server, llama.cpp's llama-server and mlx-lm's generate loop,
on the same GGUF, the same prompts, the same thread count, in one run.

Arms (each at every ``--threads`` count T):

* ``llama-server``: the upstream binary, ``-t T -tb T -np 1``, the GGUF as given (its native
  quantized kernels). Skipped, with a note, when no binary is given or found; build one with
  ``scripts/build_llama_server.sh`` (~15-25 min on 2 cores; it lands in
  ``.cache/llama-server/bin/llama-server``, which is the default here).
* ``mlxcel``: ``mlxcel-server -np 1`` as it starts by default (float32 weights, OpenBLAS and the
  one-row matmul shim preloaded), with ``OPENBLAS_NUM_THREADS=T``.
* ``mlxcel-no-sgemv``: the same server started with OpenBLAS preloaded but not the one-row matmul
  shim (OpenBLAS's sgemm for every float32 matmul), to show what the shim buys in the same run.
* ``mlxcel-f32``: the same server with ``MLXCEL_WEIGHTS=float32`` (quantized weights dequantized
  to float32, as before the CPU kernels), to show what the kernels buy in the same run.

* ``mlxcel-no-ahead``: the same server with ``MLXCEL_RUN_AHEAD=0`` (no pipelined decode steps:
  every step's tokens read back before the next step is built, ``server/runtime/run_ahead.py``).
* ``mlxcel-layer-ops``: the same server with ``MLXCEL_FUSED_LAYER=0`` (each decoder layer of the
  ragged step as its separate primitives, not the two layer primitives of ``qmatmul_src/layer.h``).
* ``mlxcel+VAR=VALUE[+VAR=VALUE...]``: the same server with those environment variables set (a
  runtime knob against the default in one run, e.g. ``mlxcel+MLXCEL_KERNEL_WORKERS=normal``).
* ``mlxcel-base``: the same server from another source tree (``--base-tree DIR``, e.g. main's:
  ``git -C <main> archive HEAD | tar -x -C DIR``, with the built extension copied into
  ``DIR/engine/platform``), imported ahead of this checkout's: a before / after in one run.

``--clients N`` measures aggregate throughput instead: every server runs ``-np N`` and each round
sends N requests at once (different prompts); tok/s is all generated tokens over the round's wall
time. Each server's resident memory (VmRSS after the warm-up) is reported too.
* ``mlx_lm``: mlx-lm's ``generate_step`` in a worker process on the same weights (loaded by
  mlxcel, so float32 from the same GGUF) with OpenBLAS preloaded and no shim: mlx-lm as it runs at
  its best on this CPU without our changes.

Both servers get ``POST /completion`` with ``n_predict`` fixed, ``temperature 0``,
``ignore_eos``, ``cache_prompt: false``; decode tok/s is the response's
``timings.predicted_per_second`` (llama-server's definition, which mlxcel-server follows). The
mlx-lm worker reports generated tokens after the first / time from the first to the last. Arms are
interleaved request by request (A B C D A B C D ...), every arm runs every prompt ``--repeats``
times, and the median is reported with the load average of the run.

    ./scripts/build_llama_server.sh                     # once (optional)
    .venv/bin/python scripts/bench_vs_llama_server.py --threads 1,2 --n-predict 128 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LLAMA = REPO / ".cache" / "llama-server" / "bin" / "llama-server"
PROMPTS = [
    "The history of computing is a story of abstraction layered on abstraction. Early machines were",
    "Here is a short story about a lighthouse keeper who finds a message in a bottle:",
    "Explain, step by step, how a hash table handles collisions.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def builtin_gguf() -> str:
    from mlxcel.engine.model.loading import default_model_path

    return str(default_model_path())


class Server:
    def __init__(self, name: str, cmd: list[str], env: dict, log: Path):
        self.name = name
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        self.log = log
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not come up")
            time.sleep(0.3)

    def decode(self, prompt: str, n: int) -> dict:
        body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
                "seed": 0}
        cpu = self.cpu_s()
        r = httpx.post(self.url + "/completion", json=body, timeout=600)
        cpu = self.cpu_s() - cpu
        r.raise_for_status()
        j = r.json()
        t = j["timings"]
        return {"tps": t["predicted_per_second"], "n": t["predicted_n"], "text": j["content"],
                "cpu_ms": cpu * 1e3 / max(1, t["predicted_n"])}

    def cpu_s(self) -> float:
        """The server process's CPU time so far (user + system, every thread), in seconds."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def decode_many(self, prompts: list[str], n: int) -> dict:
        """All prompts at once; aggregate generated tokens / wall time."""
        import concurrent.futures

        start, cpu = time.perf_counter(), self.cpu_s()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            done = list(pool.map(lambda p: self.decode(p, n), prompts))
        wall, cpu = time.perf_counter() - start, self.cpu_s() - cpu
        total = sum(d["n"] for d in done)
        return {"tps": total / wall, "n": total, "text": done[0]["text"], "cpu_ms": cpu * 1e3 / max(1, total)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class MlxLmWorker:
    """A child process running mlx-lm's ``generate_step``; one JSON line in, one out."""

    def __init__(self, name: str, model: str, env: dict):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--mlx-lm-worker", "-m", model], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.proc.stdout.readline())["ready"]

    def decode(self, prompt: str, n: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompt": prompt, "n": n}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def mlx_lm_worker(model: str) -> None:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from mlxcel.engine.model.loading import load_model

    lm = load_model(model)
    print(json.dumps({"ready": True, "preload": os.environ.get("LD_PRELOAD", "")}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        ids = lm.tokenizer.encode(req["prompt"])
        first = None
        toks = []
        for tok, _ in generate_step(mx.array(ids), lm.model, max_tokens=req["n"]):
            toks.append(int(tok))
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        print(json.dumps({"tps": (len(toks) - 1) / (end - first), "n": len(toks),
                          "text": lm.tokenizer.decode(toks)}), flush=True)


def child_env(threads: int, sgemv: bool, weights: str | None = None) -> dict:
    """A server's (or worker's) environment: OpenBLAS preloaded, and the one-row matmul shim ahead of
    it when ``sgemv``."""
    from mlxcel.engine.platform.device import env_with_fast_blas

    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXCEL_BLAS_PRELOADED", "MLXCEL_WEIGHTS")}
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    if weights:
        env["MLXCEL_WEIGHTS"] = weights
    env = env_with_fast_blas(env)
    if not sgemv and "LD_PRELOAD" in env:
        env["LD_PRELOAD"] = ":".join(p for p in env["LD_PRELOAD"].split(":") if "libmlxcel_sgemv" not in p)
    return env


def tree_path(tree: str) -> str:
    """A ``PYTHONPATH`` entry under which ``mlxcel.engine`` / ``.drafters`` / ``.server`` are ``tree``'s
    (the editable install maps them to this checkout, after ``sys.path``'s own finders)."""
    root = Path(tree).resolve()
    pkg = root / ".bench-pkg" / "mlxcel"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in ("engine", "drafters", "server"):
        link = pkg / name
        if not link.exists():
            link.symlink_to(root / name)
    return str(pkg.parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-m", "--model", default=None, help="GGUF file (default: the built-in SmolLM2 Q4_1)")
    parser.add_argument("--llama-server", default=str(DEFAULT_LLAMA), help="llama-server binary")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--n-predict", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", default="llama-server,mlxcel,mlxcel-f32")
    parser.add_argument("--clients", type=int, default=1, help="concurrent requests (servers run -np N)")
    parser.add_argument("--out", default=None, help="also write the JSON result here")
    parser.add_argument("--base-tree", default=None, help="source tree the mlxcel-base arm runs (e.g. main's)")
    parser.add_argument("--mlx-lm-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = args.model or builtin_gguf()
    if args.mlx_lm_worker:
        mlx_lm_worker(model)
        return

    wanted = args.arms.split(",")
    llama = Path(args.llama_server)
    if "llama-server" in wanted and not (llama.is_file() and os.access(llama, os.X_OK)):
        print(f"note: no llama-server binary at {llama}; that arm is skipped "
              f"(build one with scripts/build_llama_server.sh)", file=sys.stderr)
        wanted.remove("llama-server")
    logs = REPO / "bench-out"
    logs.mkdir(exist_ok=True)
    arms = []
    try:
        for t in [int(x) for x in args.threads.split(",")]:
            for kind in wanted:
                name = f"{kind} t={t}"
                port = str(free_port())
                log = logs / f"vs-llama-{kind}-t{t}.log"
                if kind == "llama-server":
                    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
                    np_ = str(args.clients)
                    cmd = [str(llama), "-m", model, "-t", str(t), "-tb", str(t), "-np", np_, "-c", str(2048 * args.clients),
                           "--host", "127.0.0.1", "--port", port]
                    arms.append(Server(name, cmd, env, log))
                elif kind in ("mlxcel", "mlxcel-no-sgemv", "mlxcel-f32", "mlxcel-no-ahead", "mlxcel-layer-ops",
                              "mlxcel-base") or kind.startswith("mlxcel+"):
                    cmd = [sys.executable, "-m", "mlxcel.server.cli", "-m", model, "-np", str(args.clients),
                           "-c", str(2048 * args.clients), "-t", str(t), "--host", "127.0.0.1", "--port", port]
                    env = child_env(t, kind != "mlxcel-no-sgemv", "float32" if kind == "mlxcel-f32" else None)
                    if kind == "mlxcel-no-ahead":
                        env["MLXCEL_RUN_AHEAD"] = "0"
                    if kind.startswith("mlxcel+"):  # mlxcel+VAR=VALUE[+VAR=VALUE...]
                        env.update(kv.split("=", 1) for kv in kind.split("+")[1:])
                    if kind == "mlxcel-layer-ops":
                        env["MLXCEL_FUSED_LAYER"] = "0"
                    if kind == "mlxcel-base":
                        if not args.base_tree:
                            raise SystemExit("the mlxcel-base arm needs --base-tree")
                        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree_path(args.base_tree),
                                                                           env.get("PYTHONPATH")]))
                    arms.append(Server(name, cmd, env, log))
                elif kind == "mlx_lm":
                    arms.append(MlxLmWorker(name, model, child_env(t, sgemv=False)))
                else:
                    raise SystemExit(f"unknown arm {kind}")
        for arm in arms:  # warm-up
            arm.decode(PROMPTS[0], 8)
        rss = {arm.name: arm.rss_mb() for arm in arms if isinstance(arm, Server)}
        load_start = os.getloadavg()[0]
        results = {arm.name: [] for arm in arms}
        cpu = {arm.name: [] for arm in arms}
        texts = {}
        for _ in range(args.repeats):
            for i, prompt in enumerate(PROMPTS):
                for arm in arms:
                    if args.clients > 1:
                        batch = [PROMPTS[(i + j) % len(PROMPTS)] + f" (request {j})" for j in range(args.clients)]
                        r = arm.decode_many(batch, args.n_predict)
                    else:
                        r = arm.decode(prompt, args.n_predict)
                    results[arm.name].append(r["tps"])
                    if "cpu_ms" in r:
                        cpu[arm.name].append(r["cpu_ms"])
                    texts.setdefault(arm.name, {})[prompt] = r["text"]
        load_end = os.getloadavg()[0]
    finally:
        for arm in arms:
            arm.stop()

    med = {name: statistics.median(v) for name, v in results.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu.items() if v}
    out = {"model": Path(model).name, "n_predict": args.n_predict, "repeats": args.repeats, "clients": args.clients,
           "prompts": len(PROMPTS), "load_avg_start": load_start, "load_avg_end": load_end,
           "median_decode_tps": med, "all_decode_tps": results, "rss_mb": rss,
           "median_cpu_ms_per_token": med_cpu}
    print(json.dumps(out))
    what = "decode tok/s" if args.clients == 1 else f"aggregate tok/s, {args.clients} clients"
    print(f"\n{out['model']}, n_predict {args.n_predict}, {len(PROMPTS)} prompts x {args.repeats} repeats, "
          f"{args.clients} client(s), load average {load_start:.1f} -> {load_end:.1f}\n")
    threads = sorted({name.split("t=")[1] for name in med})
    print(f"| threads | arm | {what} (median) | mlxcel / arm | server CPU ms / token (median) | RSS MB |")
    print("|---:|---|---:|---:|---:|---:|")
    for t in threads:
        ours = med.get(f"mlxcel t={t}")
        for name, v in med.items():
            if name.endswith(f"t={t}"):
                ratio = f"{ours / v:.2f}x" if ours else "-"
                c = f"{med_cpu[name]:.2f}" if name in med_cpu else "-"
                print(f"| {t} | {name.split(' t=')[0]} | {v:.1f} | {ratio} | {c} | {rss.get(name, float('nan')):.0f} |")
    for t in threads:
        ours = texts.get(f"mlxcel t={t}")
        for name, other in texts.items():
            if ours and name.startswith("mlxcel-") and name.endswith(f"t={t}") and "f32" not in name:
                same = sum(ours[p] == other[p] for p in ours)
                print(f"\nt={t}: mlxcel and {name.split(' t=')[0]} texts identical on {same}/{len(ours)} prompts")
    for t in threads:
        a, b = texts.get(f"mlxcel t={t}"), texts.get(f"llama-server t={t}")
        if a and b:
            same = sum(a[p] == b[p] for p in a)
            print(f"\nt={t}: mlxcel and llama-server texts identical on {same}/{len(a)} prompts "
                  f"(both multiply the quantized blocks by 8-bit activations, llama.cpp per 32 with Q8_1 rounding, "
                  f"mlxcel per 32 with its own, so the two are different roundings of the same model)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
