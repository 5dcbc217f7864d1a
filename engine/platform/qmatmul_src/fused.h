// One-primitive CPU versions of the small ops a decoder layer runs around its matmuls: RMS norm,
// rotary embedding and attention. MLX's CPU backend builds each of them from 6-15 primitives
// (rope's fallback graph, the norm's square/sum/rsqrt/multiplies, attention's matmuls, softmax and
// transposes), and on a 135M model those primitives' fixed cost is most of a decode step. Each
// row (token) is computed by the same code whatever the number of rows, like the matmul kernel.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxcel_q {

namespace mx = mlx::core;

// silu(gate) * x = gate * sigmoid(gate) * x, element-wise, float32 (the MLP's activation).
mx::array swiglu(const mx::array& gate, const mx::array& x);
// x[..., d] * rsqrt(mean(x^2) + eps) * w, float32.
mx::array rms_norm(const mx::array& x, const mx::array& w, float eps);
// x[b, h, l, d] rotated at positions offset + l (the first `dims` features; half-split or
// interleaved pairs), frequencies base^(-2i/dims) * scale. float32, contiguous output.
mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale, int offset);
// softmax(q k^T * scale [+ causal mask aligned to the last query]) v; q[b, hq, l, d],
// k/v[b, hkv, s, d] (any strides), hq a multiple of hkv. Output [b, hq, l, d] float32.
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal);

}  // namespace mlxcel_q
