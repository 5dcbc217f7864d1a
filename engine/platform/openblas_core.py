"""Which of OpenBLAS's kernel sets a Linux x86-64 CPU asks for (``OPENBLAS_CORETYPE``).

Debian 12's OpenBLAS (0.3.21, built with ``DYNAMIC_ARCH``) picks its kernels by CPU model, and a
model newer than the library is matched by feature: an AMD Zen 5 (AVX-512 F/BW/VL/DQ) runs the
AVX2 ``Haswell`` set, where a Zen 4 or an Intel Skylake-X runs ``SkylakeX``. The two sets round a
float32 product differently as the matrix height changes: with ``SkylakeX`` a row's result does not
depend on how many rows the call has (from two up), which is what lets a float32 model's batched
and block forwards give each row the bits it gets alone (the ragged batch, the recurrent state
tape and the exactness probe rely on it; measured here on a Zen 5, where ``Haswell`` broke seven
of those exactness tests and ``SkylakeX`` passes them; ``SkylakeX`` is also the faster set there,
a 64 x 576 by 576 x 1536 float32 product 0.80 ms against 1.49 on one thread). So on a CPU with those AVX-512 extensions
the ``SkylakeX`` set is asked for, replacing an inherited ``OPENBLAS_CORETYPE`` (some machines
export ``Haswell`` for every process, which is what this CPU was found running);
``MLXCEL_OPENBLAS_CORETYPE`` names another set, or ``keep`` leaves the inherited choice alone.

Kept apart from ``device`` (which imports MLX) because ``scripts/with-blas`` runs it before
starting the process that loads OpenBLAS: the variable is read once, when the library loads.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from pathlib import Path

from mlxcel.engine.platform.settings import settings, value_in

_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def coretype(env: Mapping[str, str] | None = None) -> str | None:
    """The ``OPENBLAS_CORETYPE`` to start a process with (whose environment is ``env``, default
    this process's), or None to leave OpenBLAS's choice."""
    forced = settings().openblas_coretype if env is None else value_in(env, "openblas_coretype")
    if forced is not None:
        return None if forced == "keep" else forced
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    return "SkylakeX" if _AVX512 <= cpu_flags() else None


if __name__ == "__main__":
    core = coretype()
    if core:
        print(core)
