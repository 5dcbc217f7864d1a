// NEON with the dot-product extension (armv8.2-a+dotprod): one 128-bit register = 4 features x 4
// inputs (a tile in four slices); sdot multiplies signed bytes, so 4- and 6-bit values (< 64) go
// in as they are and 8-bit values as u - 128, corrected by + 128 sum x (as the AVX2 kernel).
#include <arm_neon.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "unit.h"

namespace mlxcel_q::neon {

struct V {
  using vi = int32x4_t;
  using vf = float32x4_t;
  static constexpr int L = 4;
  static constexpr int MAXR = 4;
  static inline vf zero() { return vdupq_n_f32(0.f); }
  static inline vi izero() { return vdupq_n_s32(0); }
  static inline vi load(const uint8_t* p) { return vreinterpretq_s32_u8(vld1q_u8(p)); }
  static inline vi lo_nibble(vi v) { return vreinterpretq_s32_u8(vandq_u8(vreinterpretq_u8_s32(v), vdupq_n_u8(0x0f))); }
  static inline vi hi_nibble(vi v) { return vreinterpretq_s32_u8(vshrq_n_u8(vreinterpretq_u8_s32(v), 4)); }
  static inline vi add16_where(vi w, uint64_t mask) {
    const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint16_t m16 = uint16_t(mask);
    uint8x16_t m = vcombine_u8(vdup_n_u8(uint8_t(m16)), vdup_n_u8(uint8_t(m16 >> 8)));
    uint8x16_t set = vtstq_u8(m, vld1q_u8(bits));
    return vreinterpretq_s32_u8(vorrq_u8(vreinterpretq_u8_s32(w), vandq_u8(set, vdupq_n_u8(16))));
  }
  template <int t>
  static inline vi or_high2(vi w, vi h) {
    uint8x16_t hb = vreinterpretq_u8_s32(h);
    uint8x16_t sh;
    if constexpr (t == 0) sh = hb;
    else sh = vshrq_n_u8(hb, 2 * t);
    uint8x16_t s = vandq_u8(sh, vdupq_n_u8(3));
    return vreinterpretq_s32_u8(vorrq_u8(vreinterpretq_u8_s32(w), vshlq_n_u8(s, 4)));
  }
  static inline int8x16_t bcast(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
  }
  static inline vi dot(vi acc, vi w, const int8_t* x) { return vdotq_s32(acc, vreinterpretq_s8_s32(w), bcast(x)); }
  static inline vi dot8(vi acc, vi w, const int8_t* x) {
    int8x16_t ws = vreinterpretq_s8_u8(veorq_u8(vreinterpretq_u8_s32(w), vdupq_n_u8(0x80)));
    return vdotq_s32(acc, ws, bcast(x));
  }
  static inline vi add_i(vi a, vi b) { return vaddq_s32(a, b); }
  static inline vi fix8(vi d, int32_t s) { return vaddq_s32(d, vdupq_n_s32(128 * s)); }
  static inline vi sub_i(vi d, int32_t v) { return vsubq_s32(d, vdupq_n_s32(v)); }
  static inline vf cvt(vi v) { return vcvtq_f32_s32(v); }
  static inline vf half(const uint8_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)p))); }
  static inline vf u8f(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    uint16x8_t w = vmovl_u8(vcreate_u8(v));
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(w)));
  }
  static inline vf i8f(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    int16x8_t w = vmovl_s8(vreinterpret_s8_u8(vcreate_u8(v)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
  }
  static inline vf loadf(const uint8_t* p) { return vld1q_f32((const float*)p); }
  static inline vf mul(vf a, vf b) { return vmulq_f32(a, b); }
  static inline vf neg(vf a) { return vsubq_f32(vdupq_n_f32(0.f), a); }
  static inline vf set1(float v) { return vdupq_n_f32(v); }
  static inline vf bcastf(const float* p) { return vld1q_dup_f32(p); }
  static inline vf fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
  static inline void storef(float* p, vf v) { vst1q_f32(p, v); }
};

#define MAXR_8 0
#include "kernel_body.h"

}  // namespace mlxcel_q::neon
