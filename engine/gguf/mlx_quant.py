"""GGUF matrices as MLX quantized weights, so that on the MLX-native path (Metal, CUDA, or
``MLXCEL_WEIGHTS=quantized``) a GGUF stays about its file size instead of growing to float16.

MLX's affine quantization keeps, per group of 32 consecutive elements of a row, a scale s and a
bias b (in the compute dtype) and per element a code q of ``bits`` bits: w = s q + b.
``LAYOUTS`` gives every llama.cpp type its MLX layout:

- exact (``block_codes``): Q4_0, Q4_1, Q4_K at 4 bits, Q5_0, Q5_1, Q5_K at 5, Q8_0 at 8, MXFP4 as
  MLX's ``mxfp4`` mode; the values equal gguf-py's decoding up to the rounding of each group's
  scale and bias to the compute dtype (none at all for MXFP4, whose scale is a power of two);
- re-quantized: the others have no MLX layout that holds their values at a similar size (Q6_K,
  Q3_K, Q2_K, IQ2_XS/S and IQ1_M change scale every 16 elements, the IQ and TQ types store
  codebook or ternary values), so their float values (gguf-py's reference) are quantized again
  (``requantize``) in groups of 32, as a rule at two bits more than the type spends per code: the
  new rounding step is then about a quarter of the type's own, so the error added stays small
  beside the type's own. Where a type's levels fall on MLX's evenly spaced grid at fewer bits
  with about the same error or less, it takes those (IQ3_XXS, IQ3_S and IQ2_XXS one bit fewer;
  IQ1_S and the ternary TQ types exact at 2 bits).
  Q6_K keeps 6 bits rather than 8, for memory: Qwen2.5-Coder-1.5B Q4_K_M then predicts within a
  mean KL divergence of 1.7e-3 of its exact decoding (1.1e-4 at 8 bits, which would cost it
  108 MB). Exact 8-bit layouts exist for Q3_K, IQ4_NL and IQ4_XS but cost twice the memory.
  docs/gguf-architectures.md has every type's measured error.

Conversion runs over chunks of rows, so loading a large matrix never holds more than a chunk of
float32 values at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.gguf import block_codes
from mlxcel.engine.gguf.file import TensorInfo

GROUP_SIZE = 32
CHUNK_ELEMENTS = 1 << 22  # rows converted at a time: about this many elements (16 MiB of float32)


@dataclass(frozen=True)
class Layout:
    """How one GGUF type lives in MLX: code width, MLX mode, and whether it is exact."""

    bits: int
    mode: str = "affine"
    exact: bool = True

    @property
    def bits_per_weight(self) -> float:
        """Memory per element with float16 scales (and biases, in affine mode)."""
        side_bits = 2 * 16 if self.mode == "affine" else 8  # two float16, or one E8M0 byte
        return self.bits + side_bits / GROUP_SIZE


LAYOUTS: dict[Q, Layout] = {
    Q.Q4_0: Layout(4), Q.Q4_1: Layout(4), Q.Q4_K: Layout(4),
    Q.Q5_0: Layout(5), Q.Q5_1: Layout(5), Q.Q5_K: Layout(5),
    Q.Q8_0: Layout(8), Q.MXFP4: Layout(4, "mxfp4"),
    # re-quantized; the widths are the module docstring's rule, errors in docs/gguf-architectures.md
    Q.Q6_K: Layout(6, exact=False),  # not 8: memory (module docstring)
    Q.Q3_K: Layout(5, exact=False), Q.Q2_K: Layout(4, exact=False),
    Q.IQ4_NL: Layout(6, exact=False), Q.IQ4_XS: Layout(6, exact=False),
    Q.IQ3_XXS: Layout(4, exact=False), Q.IQ3_S: Layout(4, exact=False),  # levels on a 4-bit grid
    Q.IQ2_XXS: Layout(3, exact=False), Q.IQ2_XS: Layout(4, exact=False), Q.IQ2_S: Layout(4, exact=False),
    Q.IQ1_S: Layout(2, exact=False), Q.IQ1_M: Layout(3, exact=False),
    Q.TQ1_0: Layout(2, exact=False), Q.TQ2_0: Layout(2, exact=False),
}


@dataclass
class QuantizedWeight:
    """An MLX-quantized matrix, or stack of matrices (what ``nn.QuantizedLinear``,
    ``nn.QuantizedEmbedding`` and mlx-lm's ``QuantizedSwitchLinear`` hold)."""

    weight: mx.array  # uint32, packed along the last axis
    scales: mx.array
    biases: mx.array | None  # None in mxfp4 mode
    bits: int
    group_size: int = GROUP_SIZE
    mode: str = "affine"

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the matrix it stands for."""
        return (*self.weight.shape[:-1], self.weight.shape[-1] * 32 // self.bits)

    def dequantize(self, dtype: mx.Dtype) -> mx.array:
        # Scales and biases in float32 first: dequantizing in float16 would round every weight.
        scales = self.scales if self.mode != "affine" else self.scales.astype(mx.float32)
        biases = None if self.biases is None else self.biases.astype(mx.float32)
        out = mx.dequantize(self.weight, scales, biases, group_size=self.group_size, bits=self.bits,
                            mode=self.mode, dtype=mx.float32)
        return out.astype(dtype)


def keeps_quantized(info: TensorInfo) -> bool:
    """Whether ``to_quantized`` takes this tensor: a matrix (or stack of them) of a type in
    ``LAYOUTS`` whose rows split into groups of 32."""
    return info.qtype in LAYOUTS and len(info.shape) >= 2 and info.shape[-1] % GROUP_SIZE == 0


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (uint8, last axis a multiple of 8) in MLX's packing: element k of a row takes bits
    ``k*bits .. (k+1)*bits - 1`` of the row's little-endian bit stream, read as uint32 words."""
    *lead, k = codes.shape
    eight = codes.reshape(*lead, k // 8, 8).astype(np.uint64)
    word = np.zeros(eight.shape[:-1], np.uint64)
    for i in range(8):
        word |= eight[..., i] << np.uint64(i * bits)
    out = word[..., None].view(np.uint8)[..., :bits]  # 8 codes fill exactly ``bits`` bytes
    return np.ascontiguousarray(out).reshape(*lead, k * bits // 8).view(np.uint32)


def _exact_pieces(qtype: Q, raw: np.ndarray, layout: Layout, dtype: mx.Dtype) -> block_codes.Pieces:
    rows = raw.shape[0]
    codes, scales, biases = block_codes.pieces(qtype, raw.reshape(-1, GGML_QUANT_SIZES[qtype][1]))
    return codes.reshape(rows, -1), scales.reshape(rows, -1), None if biases is None else biases.reshape(rows, -1)


def _requantized_pieces(qtype: Q, raw: np.ndarray, layout: Layout, dtype: mx.Dtype) -> block_codes.Pieces:
    values = mx.array(quants.dequantize(raw, qtype).astype(np.float32, copy=False))
    codes, scales, biases = requantize(values, layout.bits, dtype)
    return np.array(codes), np.array(scales), np.array(biases)


def requantize(values: mx.array, bits: int, dtype: mx.Dtype) -> tuple[mx.array, mx.array, mx.array]:
    """Float32 rows as affine codes (uint8), scales and biases (float32 holding ``dtype`` values)
    in groups of 32.

    Each group's bias is its minimum; its step is the range over n intervals, n tried from
    ``2**bits - 1`` down by up to three, keeping the n with the least squared error. The fewer
    intervals let a step fall on the evenly spaced levels many of these types store (a ternary
    {-d, 0, d} needs an even count, which ``2**bits - 1`` never is), so the lattice types come
    out exact or nearly (docs/gguf-architectures.md). ``mx.quantize`` instead keeps zero exactly
    representable, which cost IQ2_XXS four times the error at 4 bits."""
    r, k = values.shape
    groups = values.reshape(r, k // GROUP_SIZE, GROUP_SIZE)
    lo, hi = groups.min(-1, keepdims=True), groups.max(-1, keepdims=True)
    bias = lo.astype(dtype).astype(mx.float32)  # codes are chosen for the values that are stored
    top = 2 ** bits - 1
    best = None
    for n in range(top, max(0, top - 4), -1):
        scale = ((hi - lo) / n).astype(dtype).astype(mx.float32)
        codes = mx.clip(mx.round((groups - bias) / mx.where(scale > 0, scale, 1)), 0, top)
        err = mx.square(codes * scale + bias - groups).sum(-1, keepdims=True)
        if best is None:
            best = (err, codes, scale)
            continue
        better = err < best[0]
        best = (mx.where(better, err, best[0]), mx.where(better, codes, best[1]), mx.where(better, scale, best[2]))
    _, codes, scale = best
    return codes.astype(mx.uint8).reshape(r, k), scale.reshape(r, -1), bias.reshape(r, -1)


def to_quantized(info: TensorInfo, dtype: mx.Dtype) -> QuantizedWeight:
    """A tensor accepted by ``keeps_quantized`` as a ``QuantizedWeight`` whose scales and biases
    are in ``dtype`` (MXFP4's exponent bytes stay uint8)."""
    layout = LAYOUTS[info.qtype]
    lead, k = info.shape[:-1], info.shape[-1]
    raw = info.data.reshape(-1, info.data.shape[-1])
    n = raw.shape[0]
    packed = np.empty((n, k * layout.bits // 32), np.uint32)
    scales = np.empty((n, k // GROUP_SIZE), np.float32 if layout.mode == "affine" else np.uint8)
    biases = np.empty((n, k // GROUP_SIZE), np.float32) if layout.mode == "affine" else None
    pieces = _exact_pieces if layout.exact else _requantized_pieces
    step = max(1, CHUNK_ELEMENTS // k)
    for i in range(0, n, step):
        codes, scales[i:i + step], b = pieces(info.qtype, raw[i:i + step], layout, dtype)
        packed[i:i + step] = pack_codes(codes, layout.bits)
        if biases is not None:
            biases[i:i + step] = b
    out = QuantizedWeight(mx.array(packed.reshape(*lead, -1)), mx.array(scales.reshape(*lead, -1)),
                          None if biases is None else mx.array(biases.reshape(*lead, -1)).astype(dtype),
                          bits=layout.bits, mode=layout.mode)
    if layout.mode == "affine":
        out.scales = out.scales.astype(dtype)
    mx.eval(out.weight, out.scales, *([] if out.biases is None else [out.biases]))  # drop float32 copies now
    return out
