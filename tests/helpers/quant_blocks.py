"""Random GGUF blocks for the kernel tests: random bytes are valid blocks once the f16 scale
fields hold finite values."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

# Byte offsets of the f16 fields in each block type.
HALF_FIELDS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q8_0: [0], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_blocks(qtype, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for at in HALF_FIELDS[qtype]:
        scale = (rng.standard_normal((n, k // block)) * 0.02).astype(np.float16)
        raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(n, k // block, 2)
    return raw.reshape(n, -1)
