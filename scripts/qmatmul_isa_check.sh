#!/usr/bin/env bash
# The NEON kernel checked on an x86-64 machine: cross-compiled for arm64 and run under qemu against
# the portable kernel (bitwise, every packed type at 1..11 rows, float32 tiles at 1..13). Needs g++-aarch64-linux-gnu and
# qemu-user (Debian packages); not part of the test suite.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
src="$here/engine/platform/qmatmul_src"
out="$(mktemp -d)"
aarch64-linux-gnu-g++ -std=c++20 -O2 -ffp-contract=off -I"$src" "$here/scripts/qmatmul_isa_check.cpp" \
  "$src/common.cpp" "$src/repack.cpp" "$src/kernels_scalar.cpp" "$src/kernels_neon.cpp" \
  "$src/fkernel_scalar.cpp" "$src/fkernel_neon.cpp" \
  -march=armv8.2-a+dotprod+fp16 -static -o "$out/check"
qemu-aarch64 -cpu max "$out/check"
rm -rf "$out"
