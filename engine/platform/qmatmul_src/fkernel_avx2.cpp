// Float kernel, AVX2 + FMA: a tile in two ymm slices; one tile at a time, up to 6 rows (12
// accumulators of the 16 registers).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>

#include "fkernel.h"

namespace mlxcel_q::avx2 {

struct FV {
  using vf = __m256;
  static constexpr int L = 8;
  static constexpr int TT = 1;
  static constexpr int MAXR = 6;
  static inline vf zero() { return _mm256_setzero_ps(); }
  static inline vf load(const float* p) { return _mm256_loadu_ps(p); }
  static inline vf bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static inline vf fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
  static inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
};

#include "fkernel_body.h"

}  // namespace mlxcel_q::avx2
