"""Turn GGUF tensors into MLX arrays: llama.cpp's block formats and its q/k row order
(tensor names are ``names.py``'s).

Three block formats map exactly onto MLX's affine quantization (groups of 32, one scale and
one bias per group), so on a GPU they stay quantized without any loss:

    Q8_0  w = d * q,          q int8        ->  bits 8, scale d, bias -128 d, q + 128
    Q4_0  w = d * (q - 8),    q in 0..15    ->  bits 4, scale d, bias -8 d
    Q4_1  w = d * q + m,      q in 0..15    ->  bits 4, scale d, bias m

(Q4 blocks store element j in the low nibble of byte j and element j + 16 in the high nibble;
MLX packs element k into bits 4 (k mod 8) of word k / 8, so the nibbles are re-ordered.)
Every other type (K-quants, Q5_*, IQ*, BF16) is dequantized with the ``gguf`` package's
reference numpy code, in float32, then cast to the compute dtype.

On a CPU with mlxcel's kernels (``to_packed``), quantized matrices instead stay in their own
blocks, re-laid out for the kernels (``engine/platform/qmatmul.py``): Q4_0, Q4_1, Q8_0, Q4_K, Q5_K
and Q6_K exactly; any other quantized type is re-packed to Q8_0 (dequantized, then quantized to
8 bits per block of 32: the nearest format the kernels run, not bit-exact; the loader logs it).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from mlxcel.engine.errors import UnsupportedQuantError
from mlxcel.engine.gguf.file import TensorInfo
from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.qmatmul import PackedWeight

GROUP_SIZE = 32
AFFINE_BLOCK_TYPES = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q8_0: 8}


@dataclass
class QuantizedWeight:
    """An MLX affine-quantized matrix (what ``nn.QuantizedLinear`` holds)."""

    weight: mx.array  # uint32, packed
    scales: mx.array
    biases: mx.array
    bits: int
    group_size: int = GROUP_SIZE

    def dequantize(self, dtype: mx.Dtype) -> mx.array:
        # Scales and biases in float32 first: dequantizing in float16 would round every weight.
        out = mx.dequantize(self.weight, self.scales.astype(mx.float32), self.biases.astype(mx.float32),
                            group_size=self.group_size, bits=self.bits)
        return out.astype(dtype)


def affine_triplet(info: TensorInfo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed uint32 weights, float16 scales, float16 biases) for a Q4_0 / Q4_1 / Q8_0 tensor."""
    rows = info.data.shape[:-1]
    n_blocks = info.shape[-1] // GROUP_SIZE
    blocks = info.data.reshape(*rows, n_blocks, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if info.qtype == Q.Q8_0:
        q = blocks[..., 2:].view(np.int8).astype(np.int16) + 128
        packed = q.astype(np.uint8).reshape(*rows, -1).view(np.uint32)
        return packed, d, (d.astype(np.float32) * -128).astype(np.float16)
    if info.qtype == Q.Q4_0:
        bias = (d.astype(np.float32) * -8).astype(np.float16)
        qs = blocks[..., 2:]
    elif info.qtype == Q.Q4_1:
        bias = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        qs = blocks[..., 4:]
    else:
        raise ValueError(f"not an affine block type: {info.qtype.name}")
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # element order 0..31 within a block
    packed = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8)
    return packed.reshape(*rows, -1).view(np.uint32), d, bias


def dequantize_numpy(info: TensorInfo) -> np.ndarray:
    """Float32 values of any tensor the ``gguf`` package can decode."""
    if info.qtype in (Q.F32, Q.F16, Q.F64):
        return np.asarray(info.data, dtype=np.float32)
    try:
        return quants.dequantize(info.data, info.qtype).astype(np.float32, copy=False)
    except NotImplementedError:
        raise UnsupportedQuantError(
            f"tensor {info.name!r} uses ggml type {info.qtype.name}, which mlxcel cannot read; "
            "re-quantize the model to a common type (Q4_K_M, Q8_0, ...)"
        ) from None


def to_mlx(info: TensorInfo, *, keep_quantized: bool, dtype: mx.Dtype) -> mx.array | QuantizedWeight:
    """One tensor as MLX: a ``QuantizedWeight`` for Q4_0/Q4_1/Q8_0 matrices when
    ``keep_quantized``, otherwise a float array in ``dtype``."""
    if info.qtype in AFFINE_BLOCK_TYPES and len(info.shape) == 2:
        w, s, b = affine_triplet(info)
        triplet = QuantizedWeight(mx.array(w), mx.array(s), mx.array(b), bits=AFFINE_BLOCK_TYPES[info.qtype])
        if keep_quantized:
            triplet.scales = triplet.scales.astype(dtype)
            triplet.biases = triplet.biases.astype(dtype)
            return triplet
        return triplet.dequantize(dtype)
    if info.qtype == Q.F16 and dtype == mx.float16 or info.qtype == Q.F32 and dtype == mx.float32:
        return mx.array(info.data)
    return mx.array(dequantize_numpy(info)).astype(dtype)


FLOAT_TYPES = {Q.F32, Q.F16, Q.BF16, Q.F64}
PACKED_TYPES = {Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}


def packable(info: TensorInfo) -> bool:
    """Whether ``to_packed`` takes this tensor: a quantized matrix (float tensors stay float)."""
    return len(info.shape) == 2 and info.qtype not in FLOAT_TYPES and info.shape[-1] % GROUP_SIZE == 0


def to_packed(info: TensorInfo) -> tuple[PackedWeight, bool]:
    """A quantized matrix in the CPU kernels' packed layout, and whether it was re-packed to Q8_0
    (a type the kernels do not run as stored)."""
    n, k = info.shape
    if info.qtype in PACKED_TYPES:
        return qmatmul.pack_gguf(np.ascontiguousarray(info.data), int(info.qtype), n, k), False
    raw = quants.quantize(dequantize_numpy(info), Q.Q8_0)
    return qmatmul.pack_gguf(raw, int(Q.Q8_0), n, k), True


def llama_qk_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k permutation.

    convert_hf_to_gguf rewrites each head's rows from Hugging Face's half-split rotary layout
    (first half of the head = real parts, second half = imaginary) to llama.cpp's interleaved
    one: GGUF row ``2 i + j`` holds HF row ``j * head_dim / 2 + i``. Taking rows of the GGUF
    tensor in the returned order gives back the HF layout mlx-lm's non-traditional RoPE expects."""
    head_dim = n_rows // n_head
    if head_dim * n_head != n_rows or head_dim % 2:
        raise ValueError(f"{n_rows} rows do not split into {n_head} heads of even size")
    return np.arange(n_rows).reshape(n_head, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


def permute_rows(info: TensorInfo, order: np.ndarray) -> TensorInfo:
    """The same tensor with its rows (output features) taken in ``order`` (a permutation or a
    selection; for a stack of matrices, the rows of each). Blocks run along rows, so this works
    on raw quantized bytes as well as on floats."""
    axis = 0 if info.data.ndim == 1 else info.data.ndim - 2
    data = np.take(info.data, order, axis=axis)
    shape = info.shape[:axis] + (len(order),) + info.shape[axis + 1:]
    return TensorInfo(name=info.name, qtype=info.qtype, shape=shape, data=data)


def concat_rows(infos: list[TensorInfo]) -> TensorInfo:
    """Several tensors' rows stacked, as one tensor: raw when they share a type (blocks never
    span rows), else as float32."""
    if len(infos) == 1:
        return infos[0]
    axis = 0 if infos[0].data.ndim == 1 else infos[0].data.ndim - 2
    if len({info.qtype for info in infos}) == 1:
        data = np.concatenate([info.data for info in infos], axis=axis)
        qtype = infos[0].qtype
    else:
        data = np.concatenate([dequantize_numpy(info) for info in infos], axis=axis)
        qtype = Q.F32
    shape = infos[0].shape[:axis] + (sum(info.shape[axis] for info in infos),) + infos[0].shape[axis + 1:]
    return TensorInfo(name="+".join(info.name for info in infos), qtype=qtype, shape=shape, data=data)
