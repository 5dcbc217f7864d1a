// Float kernel, AVX-512F: one zmm = one input's weights for a tile's 16 features; two tiles at
// once, up to 8 rows (16 accumulators).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>

#include "fkernel.h"

namespace mlxcel_q::avx512 {

struct FV {
  using vf = __m512;
  static constexpr int L = 16;
  static constexpr int TT = 2;
  static constexpr int MAXR = 12;
  static inline vf zero() { return _mm512_setzero_ps(); }
  static inline vf load(const float* p) { return _mm512_loadu_ps(p); }
  static inline vf bcast(const float* p) { return _mm512_set1_ps(*p); }
  static inline vf fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
  static inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
};

#include "fkernel_body.h"

}  // namespace mlxcel_q::avx512
