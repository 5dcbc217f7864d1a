"""The CPU kernels for quantized weights (``qmatmul_src/``, an MLX extension built at install by
``setup.py``): loading them, and the packed weight they run on.

A packed weight is one uint8 MLX array holding a matrix in the tiled layout of
``qmatmul_src/layout.h`` (16 output features per tile, each block's values interleaved across
the 16 features), made from a GGUF tensor's own blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) or an
MLX affine-quantized matrix (4 or 8 bits, groups of 32/64/128). ``qmatmul(x, w)`` is a custom MLX
primitive whose CPU evaluation quantizes each activation row to int8 blocks of 32 and runs integer
dot products (AVX-512 VNNI, AVX2, NEON or portable code, chosen at run time), streaming the packed
matrix once per call for up to 16 rows at a time, threaded over output features.

Why hand-written: MLX's own CPU quantized matmul is a scalar loop (slower than float32 +
OpenBLAS, ``docs/benchmarks.md``), and it has no kernel for GGUF's K-quant block formats at all.

When the extension is missing (no compiler at install), was built against another MLX, or
``MLXCEL_CPU_KERNELS=0``, ``available()`` is False and one log line says why; the CPU then runs the
float32 path. Nothing here runs on Metal or CUDA (``device.py`` decides).
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass

import mlx.core as mx

from mlxcel.engine.platform.settings import settings, variable

log = logging.getLogger(__name__)

# ggml type ids; the affine ids are the extension's own.
Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 8, 12, 13, 14
AFFINE4, AFFINE8 = 104, 108
F32 = 132  # float32 tiles (qmatmul_src/fkernel.h)
GGUF_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}

_ext = None
_why: str | None = None
_checked = False


def _load():
    global _ext, _why, _checked
    if _checked:
        return _ext
    _checked = True
    if not settings().cpu_kernels:
        _why = f"{variable('cpu_kernels')}=0"
    else:
        try:
            ext = importlib.import_module("mlxcel.engine.platform._qmatmul")
        except ImportError as exc:
            _why = f"the extension is not built ({exc})"
        else:
            running = mx.__version__.split(".dev")[0]
            if ext.MLX_VERSION != running:
                _why = f"built against MLX {ext.MLX_VERSION}, running {running}; reinstall mlxcel"
            else:
                _ext = ext
                ext.set_num_threads(default_threads())
                log.info("CPU quantized kernels: %s (this CPU has %s)", ext.isa(), ext.available_isas())
    if _ext is None:
        log.info("CPU quantized kernels unavailable (%s): quantized weights run as float32", _why)
    return _ext


def available() -> bool:
    return _load() is not None


def unavailable_reason() -> str | None:
    _load()
    return _why


def extension():
    """The loaded extension module (raises when unavailable)."""
    ext = _load()
    if ext is None:
        raise RuntimeError(f"CPU quantized kernels unavailable: {_why}")
    return ext


def default_threads() -> int:
    """Kernel threads when ``-t`` does not say: ``OPENBLAS_NUM_THREADS`` when set (the test
    targets and shared-machine runs set 1), else every core this process may use."""
    forced = os.environ.get("OPENBLAS_NUM_THREADS", "")
    if forced.isdigit() and int(forced) > 0:
        return int(forced)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def set_threads(n: int) -> bool:
    ext = _load()
    if ext is None or n < 1:
        return False
    ext.set_num_threads(int(n))
    return True


def set_thread_split(grain_macs: int, wake_macs: int) -> tuple[int, int]:
    """How calls are split among the kernel threads: about ``grain_macs`` multiply-adds per piece
    that a thread claims, and calls under ``wake_macs`` run on the calling thread alone while the
    workers sleep (``qmatmul_src/ops.cpp``). Returns the previous pair; ``(1, 0)`` splits every
    call as finely as it goes (the tests)."""
    before = extension().set_thread_split(int(grain_macs), int(wake_macs))
    return int(before[0]), int(before[1])


@dataclass
class PackedWeight:
    """A matrix W[n, k] in the extension's packed layout."""

    packed: mx.array  # uint8, flat
    qtype: int
    n: int
    k: int
    group: int = 0  # affine group size (0 for GGUF types)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)


def pack_gguf(raw, qtype: int, n: int, k: int) -> PackedWeight:
    """A GGUF tensor's raw blocks (uint8 ``[n, row_bytes]``, numpy or MLX) packed."""
    packed = extension().repack_gguf(mx.array(raw) if not isinstance(raw, mx.array) else raw, int(qtype), n, k)
    return PackedWeight(packed, int(qtype), n, k)


def pack_affine(weight: mx.array, scales: mx.array, biases: mx.array, bits: int, group: int) -> PackedWeight:
    """An MLX affine-quantized matrix (``nn.QuantizedLinear``'s arrays) packed."""
    n = int(weight.shape[0])
    k = int(weight.shape[1]) * 32 // bits
    packed = extension().repack_affine(weight, scales, biases, bits, group, n, k)
    return PackedWeight(packed, AFFINE4 if bits == 4 else AFFINE8, n, k, group)


def pack_float(weight: mx.array) -> PackedWeight:
    """A float matrix ``[n, k]`` (any float dtype, cast to float32) re-laid as float32 tiles
    (``qmatmul_src/fkernel.h``): the same kernels' family for 1..16 rows, exact per row."""
    n, k = (int(d) for d in weight.shape)
    return PackedWeight(extension().repack_float(weight, n, k), F32, n, k)


def qmatmul(x: mx.array, w: PackedWeight) -> mx.array:
    """``x[..., k] @ W.T`` -> ``[..., n]``."""
    return _ext.qmatmul(x, w.packed, w.qtype, w.group, w.n, w.k)


def qmatmul_multi(x: mx.array, ws: list[PackedWeight]) -> list[mx.array]:
    """``[x @ W.T for W in ws]`` (all of the same ``k``) as one primitive that quantizes ``x`` once;
    each output is bitwise ``qmatmul(x, W)``."""
    return _ext.qmatmul_multi(x, [w.packed for w in ws], [w.qtype for w in ws], [w.group for w in ws],
                              [w.n for w in ws], ws[0].k)


def qmatmul_multi_args(x: mx.array, packed: list[mx.array], qtypes: list[int], groups: list[int], ns: list[int],
                       k: int) -> list[mx.array]:
    """``qmatmul_multi`` with its argument lists already made (``packed_modules.SharedInput``)."""
    return _ext.qmatmul_multi(x, packed, qtypes, groups, ns, k)


def has_multi() -> bool:
    """Whether the loaded extension has ``qmatmul_multi`` (builds from before it do not)."""
    ext = _load()
    return ext is not None and hasattr(ext, "qmatmul_multi")


def dequant_rows(ids: mx.array, w: PackedWeight) -> mx.array:
    """Rows ``ids`` of W in float32: ``ids.shape + [k]``."""
    return _ext.dequant_rows(ids, w.packed, w.qtype, w.group, w.n, w.k)


def dequantize(w: PackedWeight) -> mx.array:
    """The whole matrix in float32 (tests and references)."""
    return dequant_rows(mx.arange(w.n, dtype=mx.int32), w)
