// AVX2 + FMA + F16C: one ymm = 8 features x 4 inputs (a tile in two slices); maddubs + madd
// take the place of vpdpbusd. 8-bit weights go through the sign trick (maddubs is unsigned x
// signed and would saturate on 255 x 127 pairs): sum (u - 128) x, then + 128 sum x.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "unit.h"

namespace mlxcel_q::avx2 {

struct V {
  using vi = __m256i;
  using vf = __m256;
  static constexpr int L = 8;
  static constexpr int MAXR = 4;
  static inline vf zero() { return _mm256_setzero_ps(); }
  static inline vi izero() { return _mm256_setzero_si256(); }
  static inline vi load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static inline vi lo_nibble(vi v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
  static inline vi hi_nibble(vi v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)); }
  static inline vi add16_where(vi w, uint64_t mask) {
    const vi shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                     3, 3, 3, 3, 3, 3);
    const vi bits = _mm256_set1_epi64x(0x8040201008040201LL);
    vi m = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(uint32_t(mask))), shuf);
    vi set = _mm256_cmpeq_epi8(_mm256_and_si256(m, bits), bits);
    return _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
  }
  template <int t>
  static inline vi or_high2(vi w, vi h) {
    vi s;
    if constexpr (t == 0) s = _mm256_slli_epi16(h, 4);
    else if constexpr (t == 1) s = _mm256_slli_epi16(h, 2);
    else if constexpr (t == 2) s = h;
    else s = _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(w, _mm256_and_si256(s, _mm256_set1_epi8(0x30)));
  }
  static inline vi bcast(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
  }
  static inline vi dot(vi acc, vi w, const int8_t* x) {
    vi p = _mm256_maddubs_epi16(w, bcast(x));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  static inline vi dot8(vi acc, vi w, const int8_t* x) {
    vi ws = _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80)));
    vi p = _mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(bcast(x), ws));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  static inline vi add_i(vi a, vi b) { return _mm256_add_epi32(a, b); }
  static inline vi fix8(vi d, int32_t s) { return _mm256_add_epi32(d, _mm256_set1_epi32(128 * s)); }
  static inline vi sub_i(vi d, int32_t v) { return _mm256_sub_epi32(d, _mm256_set1_epi32(v)); }
  static inline vf cvt(vi v) { return _mm256_cvtepi32_ps(v); }
  static inline vf half(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static inline vf u8f(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  }
  static inline vf i8f(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  }
  static inline vf loadf(const uint8_t* p) { return _mm256_loadu_ps((const float*)p); }
  static inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
  static inline vf neg(vf a) { return _mm256_sub_ps(_mm256_setzero_ps(), a); }
  static inline vf set1(float v) { return _mm256_set1_ps(v); }
  static inline vf bcastf(const float* p) { return _mm256_broadcast_ss(p); }
  static inline vf fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
  static inline void storef(float* p, vf v) { _mm256_storeu_ps(p, v); }
};

#define MAXR_8 0
#include "kernel_body.h"

}  // namespace mlxcel_q::avx2
