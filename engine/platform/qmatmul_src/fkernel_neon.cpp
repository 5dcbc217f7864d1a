// Float kernel, NEON: a tile in four 128-bit slices; one tile at a time, up to 6 rows (24
// accumulators of the 32 registers). vfmaq_f32 is a fused multiply-add, as on x86.
#include <arm_neon.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>

#include "fkernel.h"

namespace mlxcel_q::neon {

struct FV {
  using vf = float32x4_t;
  static constexpr int L = 4;
  static constexpr int TT = 1;
  static constexpr int MAXR = 6;
  static inline vf zero() { return vdupq_n_f32(0.f); }
  static inline vf load(const float* p) { return vld1q_f32(p); }
  static inline vf bcast(const float* p) { return vld1q_dup_f32(p); }
  static inline vf fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
  static inline void store(float* p, vf v) { vst1q_f32(p, v); }
};

#include "fkernel_body.h"

}  // namespace mlxcel_q::neon
