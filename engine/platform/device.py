"""Every device-dependent choice lives here: which dtype weights run in, and which BLAS the
CPU build uses.

On a CPU, quantized weights (GGUF blocks, MLX affine 4/8-bit) stay packed and run on mlxcel's own
kernels (``qmatmul.py``) when they are built, and float weights too, re-laid as float32 tiles
(``float_kernels``); without the kernels everything runs in float32 on MLX's matmul with OpenBLAS
preloaded and the one-row matmul shim ahead of it (``blas_shim.py``).
MLX's own CPU quantized, f16 and bf16 matmuls all decode slower than f32 there, and its bundled
reference BLAS makes f32 prefill ~20x slower than OpenBLAS. On Metal and CUDA the weights stay as
shipped (MLX's quantized kernels are the fast path there) and nothing is preloaded.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.blas_shim import shim_library
from mlxcel.engine.platform.compiled_rope import compile_decode_rope
from mlxcel.engine.platform.fused_layers import fuse_layers
from mlxcel.engine.platform.lean_blocks import lean_blocks
from mlxcel.engine.platform.openblas_core import coretype
from mlxcel.engine.platform.packed_modules import share_inputs
from mlxcel.engine.platform.settings import settings, variable

# Debian's libopenblas0-pthread; the first that exists is used.
OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
_PRELOAD_MARK = variable("blas_preloaded")  # set in a child started with OpenBLAS preloaded


def default_blas_threads() -> str:
    """OpenBLAS threads when neither ``OPENBLAS_NUM_THREADS`` nor ``-t`` says: every core this
    process may run on, as llama-server's ``-t`` defaults to the machine's cores. On an otherwise
    idle 2-core box two threads decoded 1.4x faster than one (docs/benchmarks.md). On cores that
    other busy processes share, OpenBLAS's workers spin between calls and starve the engine's own
    threads (2-5x slower than one thread there), so shared runs pass ``-t 1`` or set
    ``OPENBLAS_NUM_THREADS=1``, as the test targets do."""
    try:
        return str(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return str(os.cpu_count() or 1)


def on_gpu() -> bool:
    """True when MLX's default device is a GPU (Metal or CUDA)."""
    return mx.default_device().type == mx.DeviceType.gpu


def mlx_native() -> bool:
    """Whether this process runs the MLX-native profile: what Metal and CUDA run (MLX's quantized
    modules, the half-precision compute dtype, mlx-lm's caches and kernels; none of mlxcel's CPU
    kernels, fused ops or the one-row matmul shim). On a GPU always; on a CPU with
    ``MLXCEL_KERNELS=mlx``, so that the path most users take is tested where no GPU is."""
    return on_gpu() or settings().kernels == "mlx"


def grammar_mask_threads() -> int:
    """Threads llguidance may spread one batched step's grammar masks over.

    On a GPU the forward leaves the host's cores idle, so the masks of many constrained rows are
    computed in parallel on llguidance's pool (every core but the engine thread's). On a CPU the
    forward itself keeps every core busy and a hand-off to pool threads only queues the masks behind
    it: measured on the 2-core box, 8 rows' masks took 35-70 us computed one after another on the
    engine thread (still without the GIL) against 120-900 us through the pool. So on a CPU they are
    computed on the engine thread. ``MLXCEL_GRAMMAR_THREADS=N`` overrides."""
    forced = settings().grammar_threads
    if forced is not None:
        return forced
    if not on_gpu():
        return 1
    return max(1, int(default_blas_threads()) - 1)


def keep_quantized_weights() -> bool:
    """Whether quantized checkpoints keep their quantized weights.

    ``MLXCEL_WEIGHTS=quantized|float32`` overrides the per-device choice."""
    forced = settings().weights
    if forced is not None:
        return forced == "quantized"
    return mlx_native()


def cpu_kernels() -> bool:
    """Whether quantized weights stay packed in their own blocks and run on mlxcel's CPU kernels
    (``qmatmul.py``): on a CPU where the extension is built, unless ``MLXCEL_WEIGHTS`` asks for
    ``float32`` or for MLX's own ``quantized`` modules. Never on Metal or CUDA."""
    if mlx_native() or settings().weights is not None:
        return False
    return qmatmul.available()


def float_kernels() -> bool:
    """Whether float weights (``nn.Linear`` / ``nn.Embedding``; bf16/f16 ones after the cast to
    float32) are re-laid at load into the CPU kernels' float32 tiles and run there instead of
    MLX's matmul (OpenBLAS sgemm, which at 2..16 rows streams the weights at a third of the memory
    rate here; docs/benchmarks.md "Float32 tiles"). With them the model also takes the packed
    models' graph changes (``prepare_for_decode``). On a CPU where the extension is built and the
    compute dtype is float32; ``MLXCEL_FLOAT_KERNEL=0`` turns it off. Never on Metal or CUDA."""
    if mlx_native() or not settings().float_kernel or compute_dtype() != mx.float32:
        return False
    if settings().weights == "quantized":
        return False  # MLX's own modules asked for: its float layers stay MLX's too
    return qmatmul.available() and hasattr(qmatmul.extension(), "repack_float")


def compute_dtype() -> mx.Dtype:
    """The dtype float weights are cast to at load time.

    GPUs keep the checkpoint's half precision; the CPU runs float32 (f16/bf16 matmuls are
    slower than f32 there)."""
    forced = settings().dtype
    if forced is not None:
        return {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[forced]
    return mx.float16 if mlx_native() else mx.float32


def openblas_library() -> str | None:
    for candidate in OPENBLAS_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return None


def preload_libraries() -> list[str]:
    """What a Linux CPU process preloads, in order: the one-row matmul shim
    (``blas_shim.py``; it must come before OpenBLAS to answer ``cblas_sgemm`` first; absent where
    no C compiler builds it) and OpenBLAS. Empty when OpenBLAS is absent."""
    lib = openblas_library()
    if lib is None:
        return []
    shim = None if mlx_native() else shim_library()
    return [shim, lib] if shim else [lib]


def env_with_fast_blas(env: dict | None = None) -> dict:
    """A copy of ``env`` (default: this process's) in which a child process starts with OpenBLAS
    (and the one-row matmul shim) preloaded, on a Linux machine that has it; unchanged elsewhere."""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux"):
        return env
    present = env.get("LD_PRELOAD", "")
    libs = preload_libraries()
    missing = [lib for lib in libs if lib not in present]
    if missing:
        env["LD_PRELOAD"] = ":".join(p for p in (*missing, present) if p)
        env[_PRELOAD_MARK] = "1"
    if libs:
        env.setdefault("OPENBLAS_NUM_THREADS", default_blas_threads())
        core = coretype(env)
        if core:
            env["OPENBLAS_CORETYPE"] = core  # openblas_core.py: the kernels that round rows alike
    return env


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count in this process (a server's ``-t N``); False when OpenBLAS is
    not loaded here."""
    lib = openblas_library()
    if lib is None or n < 1:
        return False
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    if "libopenblas" not in maps:
        return False
    ctypes.CDLL(lib).openblas_set_num_threads(int(n))
    return True


def set_cpu_threads(n: int) -> list[str]:
    """``-t N``: the threads of OpenBLAS and of the quantized-matmul kernels; what was set."""
    done = []
    if set_blas_threads(n):
        done.append("OpenBLAS")
    if qmatmul.set_threads(n):
        done.append("quantized kernels")
    return done


def reexec_with_fast_blas() -> None:
    """On a Linux CPU, re-execute this process with OpenBLAS (and the one-row matmul shim)
    preloaded: MLX then resolves its BLAS symbols there instead of the bundled reference BLAS. A
    no-op on macOS, when the library is absent, when already done, or when
    ``MLXCEL_BLAS_PRELOAD=0``."""
    if not sys.platform.startswith("linux") or settings().blas_preloaded or not settings().blas_preload:
        return
    present = os.environ.get("LD_PRELOAD", "")
    if all(lib in present for lib in preload_libraries()):
        return
    env = env_with_fast_blas()
    argv = [sys.executable, *sys.orig_argv[1:]] if hasattr(sys, "orig_argv") else [sys.executable, *sys.argv]
    os.execve(sys.executable, argv, env)


# Families whose float models (weights in float32 tiles) also take the fused ops, shared inputs and
# lean blocks: the plain decoder blocks the ragged step runs flat, and the hybrids whose block
# cut-back tests/engine/cache/test_recurrent.py checks bit for bit with them (Qwen3-Next's was not
# exact until fuse_layers took its 1-output shared-expert gate off OpenBLAS: RowwiseLinear). On
# others (MoE, gemma, ...) a float model keeps MLX's norms, rope and attention beside the float
# kernel: not checked there.
FUSED_FLOAT_TYPES = {"llama", "mistral", "qwen2", "qwen3_next", "qwen3_5", "lfm2"}


def prepare_for_decode(model) -> None:
    """Per-device graph changes for decoding, applied once after loading. On a CPU, for a model
    whose weights run on the quantized kernels: norms, rotary embeddings and attention as single
    primitives (``fused_layers.py``; ``MLXCEL_FUSED_OPS=0`` turns it off), the q/k/v and gate/up
    projections of a layer as one product each (``packed_modules.share_inputs``), and with both,
    llama / qwen2 blocks' forward as one short function over them (``lean_blocks.py``, the same
    graph with less Python); otherwise one-token rotary embeddings as one compiled kernel
    (``compiled_rope.py``; bitwise the same output). Nothing on the MLX-native profile (Metal, CUDA,
    ``MLXCEL_KERNELS=mlx``)."""
    if mlx_native():
        return
    packed = any(name.endswith(".packed") for name, _ in tree_flatten(model.parameters()))
    if packed and getattr(model, "model_type", None) not in FUSED_FLOAT_TYPES and all(
            m._spec[0] == qmatmul.F32 for _, m in model.named_modules() if hasattr(m, "_spec")):
        packed = False  # float tiles only, of a family the fused ops are not checked on: MLX's ops
    if packed and qmatmul.available():
        fused = settings().fused_ops
        if fused:
            fuse_layers(model)
        share_inputs(model)
        if fused:
            lean_blocks(model)
    compile_decode_rope(model)
