"""Turn GGUF tensors into MLX arrays: llama.cpp's block formats and its q/k row order
(tensor names are ``names.py``'s).

Three representations, chosen by the loader per device (``engine/platform/device.py``):

- MLX's own quantized weights (Metal, CUDA, ``MLXCEL_WEIGHTS=quantized``): every quantized matrix
  stays quantized, exactly where the type is MLX affine / MXFP4 quantization in disguise (Q4_0,
  Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, MXFP4) and re-quantized otherwise (``mlx_quant.py``);
- floats: anything else, and everything when weights are dequantized, decoded with the ``gguf``
  package's reference numpy code in float32, then cast to the compute dtype;
- on a CPU with mlxcel's kernels (``to_packed``), quantized matrices instead stay in their own
  blocks, re-laid out for the kernels (``engine/platform/qmatmul.py``): Q4_0, Q4_1, Q8_0, Q4_K,
  Q5_K and Q6_K exactly; any other quantized type is re-packed to Q8_0 (dequantized, then
  quantized to 8 bits per block of 32: the nearest format the kernels run, not bit-exact; the
  loader logs it).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from mlxcel.engine.errors import UnsupportedQuantError
from mlxcel.engine.gguf.file import TensorInfo
from mlxcel.engine.gguf.mlx_quant import QuantizedWeight, keeps_quantized, to_quantized
from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.qmatmul import PackedWeight

GROUP_SIZE = 32


def affine_triplet(info: TensorInfo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed uint32 weights, float16 scales, float16 biases) of a matrix of an exactly affine
    type (``mlx_quant.LAYOUTS``): for Q4_0 / Q4_1 / Q8_0 what ``mx.load``'s own GGUF reader gives."""
    w = to_quantized(info, mx.float16)
    return np.array(w.weight), np.array(w.scales), np.array(w.biases)


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
    """One tensor as MLX: a ``QuantizedWeight`` for a quantized matrix (or stack of them) when
    ``keep_quantized``, otherwise a float array in ``dtype``."""
    if keep_quantized and keeps_quantized(info):
        return to_quantized(info, dtype)
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
