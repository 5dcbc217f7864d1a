// The fused ops' per-row code (fused.cpp) over raw buffers, for primitives that chain several of
// them inside one evaluation (layer.cpp). Each function is the code its primitive runs, so a
// chain of them gives a row the same bits as the chain of primitives.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlxcel_q {

struct View4 {  // a strided [b, h, l, d] float array
  const float* p;
  int64_t s0, s1, s2, s3;
  const float* row(int b, int h, int l) const { return p + b * s0 + h * s1 + l * s2; }
};

// rows x d contiguous: o = x * rsqrt(mean(x^2) + eps) * w (rms_norm).
void rms_norm_rows(const float* x, const float* w, float* o, int d, int rows, float eps);
// o[i] = silu(g[i]) * x[i] (swiglu).
void silu_times(const float* g, const float* x, float* o, size_t n);
// x[n, h, d] (strides s0, s1, s2) rotated at positions pos[n] into o[n, h, d] contiguous (rope_positions).
void rope_positions_rows(const float* xp, int64_t s0, int64_t s1, int64_t s2, const int32_t* pos, float* op, int N,
                         int H, int D, int dims, bool trad, float base, float scale);
// q[n, hq, d] (strides qs0, qs1, qs2) against k/v[b, hkv, s, d]: o[n, hq, d] (ragged_attention).
void ragged_attention_rows(const float* qp, int64_t qs0, int64_t qs1, int64_t qs2, const View4& kv, const View4& vv,
                           const int32_t* rows, const int32_t* pos, float* op, int N, int Hq, int D, int B, int Hk,
                           int S, float scale);

}  // namespace mlxcel_q
