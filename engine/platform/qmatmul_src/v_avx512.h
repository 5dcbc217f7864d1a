// AVX-512 (F, BW, VL) + VNNI vector operations for kernel_body.h: one zmm = 16 features x 4 inputs;
// vpdpbusd multiplies the unsigned weight bytes by four broadcast signed activation bytes and
// accumulates per feature. Included inside the namespace of a translation unit compiled with
// AVX-512 flags (kernels_avx512.cpp, and kernels_amx.cpp, whose small chunks take this path).
#define ONE_ROW_AS_PAIR 1  // kernel_body.h, one_row_as_pair: measured on Zen 4

struct V {
  using vi = __m512i;
  using vf = __m512;
  static constexpr int L = 16;
  static constexpr int MAXR = 8;
  static inline vf zero() { return _mm512_setzero_ps(); }
  static inline vi izero() { return _mm512_setzero_si512(); }
  static inline vi load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static inline vi lo_nibble(vi v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
  static inline vi hi_nibble(vi v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f)); }
  static inline vi add16_where(vi w, uint64_t mask) {
    return _mm512_mask_add_epi8(w, (__mmask64)mask, w, _mm512_set1_epi8(16));
  }
  template <int t>
  static inline vi or_high2(vi w, vi h) {
    vi s;
    if constexpr (t == 0) s = _mm512_slli_epi16(h, 4);
    else if constexpr (t == 1) s = _mm512_slli_epi16(h, 2);
    else if constexpr (t == 2) s = h;
    else s = _mm512_srli_epi16(h, 2);
    return _mm512_or_si512(w, _mm512_and_si512(s, _mm512_set1_epi8(0x30)));
  }
  static inline vi bcast(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
  }
  static inline vi dot(vi acc, vi w, const int8_t* x) { return _mm512_dpbusd_epi32(acc, w, bcast(x)); }
  static inline vi dot8(vi acc, vi w, const int8_t* x) { return _mm512_dpbusd_epi32(acc, w, bcast(x)); }
  static inline vi add_i(vi a, vi b) { return _mm512_add_epi32(a, b); }
  static inline vi fix8(vi d, int32_t) { return d; }
  static inline vi sub_i(vi d, int32_t v) { return _mm512_sub_epi32(d, _mm512_set1_epi32(v)); }
  static inline vf cvt(vi v) { return _mm512_cvtepi32_ps(v); }
  static inline vf half(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static inline vf u8f(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
  }
  static inline vf i8f(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
  }
  static inline vf loadf(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
  static inline vf neg(vf a) { return _mm512_sub_ps(_mm512_setzero_ps(), a); }
  static inline vf set1(float v) { return _mm512_set1_ps(v); }
  static inline vf bcastf(const float* p) { return _mm512_set1_ps(*p); }
  static inline vf fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
  static inline void storef(float* p, vf v) { _mm512_storeu_ps(p, v); }
};
