#!/usr/bin/env bash
# The CPU-kernel goals measured in one command (docs/benchmarks.md, "Quantized weights on the CPU"):
# batch-1 decode against llama-server at 1 and 2 threads on SmolLM2-135M Q4_1 and Qwen2.5-Coder-1.5B
# Q4_K_M, aggregate throughput at 8 clients, forward cost over k tokens, and prompt lookup on the
# edit-paragraph workload. Every arm of each part runs interleaved in the same run; uptime is printed.
#
#   LLAMA_SERVER=/path/to/llama-server QWEN=/path/to/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
#       ./scripts/bench_cpu_kernels.sh [output-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-out/cpu-kernels}"
mkdir -p "$out"
LLAMA_SERVER="${LLAMA_SERVER:-.cache/llama-server/bin/llama-server}"
QWEN="${QWEN:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
PY=.venv/bin/python
# Shorter runs on a loaded machine: N=64 REPEATS=1 (defaults: 128 tokens, 3 repeats)
N="${N:-128}"; REPEATS="${REPEATS:-3}"; HALF=$((N / 2))
run() { echo "== $*"; uptime; "$@"; uptime; }
{
  run $PY scripts/bench_vs_llama_server.py --llama-server "$LLAMA_SERVER" --threads 1,2 --n-predict "$N" --repeats "$REPEATS" \
      --arms llama-server,mlxcel,mlxcel-f32 --out "$out/smollm2-decode.json"
  [ -f "$QWEN" ] && run $PY scripts/bench_vs_llama_server.py -m "$QWEN" --llama-server "$LLAMA_SERVER" --threads 1,2 \
      --n-predict "$HALF" --repeats 1 --arms llama-server,mlxcel --out "$out/qwen-decode.json"
  run $PY scripts/bench_vs_llama_server.py --llama-server "$LLAMA_SERVER" --threads 2 --n-predict "$HALF" --repeats "$REPEATS" \
      --clients 8 --arms llama-server,mlxcel --out "$out/smollm2-8-clients.json"
  run ./scripts/with-blas $PY scripts/bench_forward_width.py --threads 1
  [ -f "$QWEN" ] && run ./scripts/with-blas $PY scripts/bench_forward_width.py -m "$QWEN" --threads 1 --arms packed --reps 7
  run ./scripts/with-blas $PY scripts/bench_server_speculative.py --repeats "$REPEATS" --max-tokens 128 \
      --workloads edit-paragraph --arms plain,lookup
} 2>&1 | tee "$out/all.log"
