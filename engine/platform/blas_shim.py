"""The one-row matmul shim (``sgemv_shim.c``): built once per machine, preloaded ahead of OpenBLAS.

MLX's Linux CPU backend sends every float32 matmul to ``cblas_sgemm``, including a decode
step's one-row products, where OpenBLAS's sgemm spends more time packing the weight matrix than
multiplying (``docs/benchmarks.md``, "Decode speed on the CPU"). MLX has no CPU kernel API to
plug a matrix-vector product into, and OpenBLAS has no switch for it, so the fix is a 30-line C
library that answers ``cblas_sgemm`` itself for one-row calls (with OpenBLAS's ``cblas_sgemv``)
and forwards the rest. It is compiled here, at first use, with the system C compiler into a
per-user cache (no compiler: no shim, everything else unchanged), so no binary ships with the
package.

``python -m mlxcel.engine.platform.blas_shim`` prints the library's path (nothing when it cannot
be built), which ``scripts/with-blas`` preloads; ``set_sgemv`` switches it off and on inside one
process, for benchmarks that compare both paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mlxcel.engine.platform.settings import settings

SOURCE = Path(__file__).with_name("sgemv_shim.c")


def cache_dir() -> Path:
    base = settings().cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mlxcel")
    return Path(base)


def shim_library() -> str | None:
    """Path of the built shim (building it on first use), or None when this is not Linux, the
    source is missing, or there is no working C compiler."""
    if not sys.platform.startswith("linux") or not SOURCE.exists():
        return None
    source = SOURCE.read_bytes()
    target = cache_dir() / f"libmlxcel_sgemv-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if target.exists():
        return str(target)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-ldl"],
                              capture_output=True, timeout=120)
        if done.returncode != 0:
            os.unlink(tmp)
            return None
        os.replace(tmp, target)  # atomic: concurrent builders each write their own temp file
    except (OSError, subprocess.SubprocessError):
        return None
    return str(target)


def loaded_shim():
    """A ctypes handle on the shim when this process has it loaded (preloaded at start), else None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        if "libmlxcel_sgemv-" in line:
            return ctypes.CDLL(line.split()[-1])
    return None


def set_sgemv(on: bool) -> bool:
    """Route one-row matmuls through sgemv (True) or sgemm (False) from now on, in this process;
    False when the shim is not loaded. For benchmarks that compare both paths in one process."""
    lib = loaded_shim()
    if lib is None:
        return False
    ctypes.c_int.in_dll(lib, "mlxcel_sgemv_off").value = 0 if on else 1
    return True


if __name__ == "__main__":
    path = shim_library()
    if path:
        print(path)
