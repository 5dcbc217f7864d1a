#!/usr/bin/env bash
# The accelerator check: one run, under ten minutes, one results file. On a machine with Metal or CUDA
# (MLX's default device a GPU) it runs, in this order, each step bounded by its own timeout so that a
# slow one cannot eat the others' time:
#
#   1. the MLX-native tests (`-m "mlx_native and not slow"`) under `MLXCEL_KERNELS=auto`, which on a
#      GPU is the MLX-native profile: exactness, speculation, concurrency equality, server captures;
#   2. decode and concurrency: mlxcel-server against mlx_lm.server on the same MLX 4-bit weights,
#      1, 4 and 8 clients (scripts/bench_server.py --bits 4);
#   3. speculation: prompt lookup against plain decoding on edit prompts, one client
#      (scripts/bench_server_speculative.py), and Predicted Outputs (--prediction).
#
#   PY=.venv/bin/python scripts/gpu_check.sh [RESULTS_FILE]
#
# The results file (default $OUT/gpu_check.txt when $OUT is set, as on the device tool's machines,
# else bench-out/gpu_check.txt) gets the device, versions, each step's exit status, wall time and its
# output's tail; the figures go into docs/benchmarks.md by hand, with this command and the date.
# Nothing is installed here: the machine needs the environment already (`make setup-test`, with
# `mlx[cuda12]` on CUDA), since an accelerator machine may have no network.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RESULTS=${1:-${OUT:+$OUT/gpu_check.txt}}
RESULTS=${RESULTS:-bench-out/gpu_check.txt}
mkdir -p "$(dirname "$RESULTS")"
: >"$RESULTS"
log() { printf '%s\n' "$*" | tee -a "$RESULTS"; }

device=$("$PY" - <<'EOF' 2>&1
import mlx.core as mx
import platform
dev = mx.default_device()
print(f"mlx {mx.__version__}; default device {dev}; metal {mx.metal.is_available()}; "
      f"python {platform.python_version()}; {platform.machine()}")
EOF
) || { log "gpu_check: MLX does not import: $device"; exit 1; }
log "gpu_check $(date -u +%Y-%m-%dT%H:%MZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
log "device: $device"
command -v nvidia-smi >/dev/null && log "gpu: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"
case "$device" in
  *"Device(gpu"*) ;;
  *) log "gpu_check: MLX's default device is not a GPU; the figures would be the CPU's (set FORCE=1 to go on)"
     [ "${FORCE:-0}" = 1 ] || exit 1 ;;
esac

status=0
# step NAME SECONDS CMD...: runs CMD with a timeout, records its status, time and output's tail.
step() {
  local name=$1 limit=$2; shift 2
  local out; out=$(mktemp)
  local t0=$SECONDS
  log ""
  log "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$out" 2>&1
  local rc=$?
  log "-- $name: exit $rc in $((SECONDS - t0)) s"
  tail -n 40 "$out" | tee -a "$RESULTS"
  rm -f "$out"
  [ "$rc" = 0 ] || status=1
}

export MLXCEL_KERNELS=${MLXCEL_KERNELS:-auto}
step tests 240 "$PY" -m pytest -q -x -m "mlx_native and not slow" -p no:cacheprovider
step decode-concurrency 180 "$PY" scripts/bench_server.py --bits 4 --max-tokens 64 --clients 1,4,8
step prompt-lookup 90 "$PY" scripts/bench_server_speculative.py --workloads edit-paragraph --repeats 2 --max-tokens 96
step predicted-outputs 60 "$PY" scripts/bench_server_speculative.py --prediction --repeats 1

log ""
log "gpu_check: $([ $status = 0 ] && echo ok || echo 'a step failed'); results in $RESULTS"
exit $status
