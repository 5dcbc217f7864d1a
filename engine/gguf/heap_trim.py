"""Hand the C heap's free pages back to the system once a GGUF's weights are converted.

The conversion works in chunks (``mlx_quant``'s rows, gguf-py's block decoder): float32 scratch of a
few to 16 MB at a time, which glibc carves from its heap once its adaptive mmap threshold has grown
past that size (it grows up to 32 MB), and a freed heap page goes back to the system only from the
heap's top. Loading Qwen2.5-Coder-1.5B Q4_K_M on the MLX-native path left about 170 MiB of such
free pages resident (docs/benchmarks.md, "Memory"); ``malloc_trim`` returns them. Where the C
library has no ``malloc_trim`` (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes


def release_free_heap() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
