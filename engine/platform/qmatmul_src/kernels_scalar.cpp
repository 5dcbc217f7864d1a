// Portable kernel (any CPU; the fallback where no vector ISA below is present): the same body as
// the vector kernels over plain arrays of 16 lanes, with the same integer arithmetic.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "unit.h"

namespace mlxcel_q::scalar {

struct V {
  struct vi {
    alignas(64) uint8_t b[64];
    int32_t lane(int c) const { int32_t v; std::memcpy(&v, b + 4 * c, 4); return v; }
    void set(int c, int32_t v) { std::memcpy(b + 4 * c, &v, 4); }
  };
  struct vf {
    float f[16];
  };
  static constexpr int L = 16;
  static constexpr int MAXR = 8;
  static inline vf zero() { vf r; for (float& x : r.f) x = 0.f; return r; }
  static inline vi izero() { vi r; std::memset(r.b, 0, 64); return r; }
  static inline vi load(const uint8_t* p) { vi r; std::memcpy(r.b, p, 64); return r; }
  static inline vi lo_nibble(vi v) { for (auto& x : v.b) x &= 0x0f; return v; }
  static inline vi hi_nibble(vi v) { for (auto& x : v.b) x >>= 4; return v; }
  static inline vi add16_where(vi w, uint64_t mask) {
    for (int i = 0; i < 64; ++i) if ((mask >> i) & 1) w.b[i] += 16;
    return w;
  }
  template <int t>
  static inline vi or_high2(vi w, vi h) {
    for (int i = 0; i < 64; ++i) w.b[i] |= ((h.b[i] >> (2 * t)) & 3) << 4;
    return w;
  }
  static inline vi dot(vi acc, vi w, const int8_t* x) {
    for (int c = 0; c < 16; ++c) {
      int32_t s = acc.lane(c);
      for (int j = 0; j < 4; ++j) s += int32_t(w.b[4 * c + j]) * int32_t(x[j]);
      acc.set(c, s);
    }
    return acc;
  }
  static inline vi dot8(vi acc, vi w, const int8_t* x) { return dot(acc, w, x); }
  static inline vi add_i(vi a, vi b) { for (int c = 0; c < 16; ++c) a.set(c, a.lane(c) + b.lane(c)); return a; }
  static inline vi fix8(vi d, int32_t) { return d; }
  static inline vi sub_i(vi d, int32_t v) { for (int c = 0; c < 16; ++c) d.set(c, d.lane(c) - v); return d; }
  static inline vf cvt(vi v) { vf r; for (int c = 0; c < 16; ++c) r.f[c] = float(v.lane(c)); return r; }
  static inline vf half(const uint8_t* p) { vf r; for (int c = 0; c < 16; ++c) r.f[c] = half_to_float(load_u16(p + 2 * c)); return r; }
  static inline vf u8f(const uint8_t* p) { vf r; for (int c = 0; c < 16; ++c) r.f[c] = float(p[c]); return r; }
  static inline vf i8f(const uint8_t* p) { vf r; for (int c = 0; c < 16; ++c) r.f[c] = float(int8_t(p[c])); return r; }
  static inline vf loadf(const uint8_t* p) { vf r; std::memcpy(r.f, p, 64); return r; }
  static inline vf mul(vf a, vf b) { for (int c = 0; c < 16; ++c) a.f[c] *= b.f[c]; return a; }
  static inline vf neg(vf a) { for (int c = 0; c < 16; ++c) a.f[c] = 0.f - a.f[c]; return a; }
  static inline vf set1(float v) { vf r; for (float& x : r.f) x = v; return r; }
  static inline vf bcastf(const float* p) { return set1(*p); }
  static inline vf fma(vf a, vf b, vf c) { for (int i = 0; i < 16; ++i) c.f[i] = __builtin_fmaf(a.f[i], b.f[i], c.f[i]); return c; }
  static inline void storef(float* p, vf v) { std::memcpy(p, v.f, 64); }
};

#define MAXR_8 1
#include "kernel_body.h"

}  // namespace mlxcel_q::scalar
