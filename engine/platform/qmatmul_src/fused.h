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

// The CPU stream every primitive here runs on, and an input as float32 (itself when it is one):
// the builders' helpers, shared with layer.cpp.
mx::Stream cpu();
mx::array f32(const mx::array& a);

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
// Attention for rows of different lengths with the queries laid out flat (no padding): query i,
// q[i, hq, d], belongs to row rows[i] at absolute position positions[i] and sees exactly keys
// 0 .. positions[i] of that row of k/v[b, hkv, s, d] (any strides; the caller keeps rows < b, positions < s). Each
// query is computed by `attention`'s per-query code, so its output is the same bits as there and
// whatever the other queries, rows or key capacity. rows/positions int32 [n]. Output [n, hq, d] float32.
mx::array ragged_attention(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& rows,
                           const mx::array& positions, float scale);
// x[n, h, d] with token i rotated at positions[i] (int32 [n]), with `rope`'s per-token code (same bits
// as `rope` gives that token at that position). float32, contiguous output.
mx::array rope_positions(const mx::array& x, const mx::array& positions, int dims, bool traditional, float base,
                         float scale);

// Each row's index of its largest value (x[..., n] -> uint32 [...]), exactly MLX's argmax over the
// last axis (argmax.cpp): the same answer with NaNs, infinities and ties.
mx::array argmax_rows(const mx::array& x);

}  // namespace mlxcel_q
