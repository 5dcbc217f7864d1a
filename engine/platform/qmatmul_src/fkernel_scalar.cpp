// Float kernel, portable: the vector kernels' body over plain 16-lane arrays with std::fma (the
// same roundings), plus the float repacker, the row reader and the ISA switch.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "fkernel.h"
#include "layout.h"

namespace mlxcel_q {

namespace scalar {

struct FV {
  struct vf {
    float f[16];
  };
  static constexpr int L = 16;
  static constexpr int TT = 1;
  static constexpr int MAXR = 4;
  static inline vf zero() { vf r; for (float& v : r.f) v = 0.f; return r; }
  static inline vf load(const float* p) { vf r; std::memcpy(r.f, p, sizeof r.f); return r; }
  static inline vf bcast(const float* p) { vf r; for (float& v : r.f) v = *p; return r; }
  static inline vf fma(vf a, vf b, vf c) {
    for (int i = 0; i < 16; ++i) c.f[i] = std::fma(a.f[i], b.f[i], c.f[i]);
    return c;
  }
  static inline void store(float* p, vf v) { std::memcpy(p, v.f, sizeof v.f); }
};

#include "fkernel_body.h"

}  // namespace scalar

FloatKernel float_kernel_for(const std::string& isa) {
#if defined(__x86_64__) || defined(_M_X64)
  if (isa == "avx512_vnni" || isa == "amx") return avx512::fmatmul;  // AMX: the int8 kernel only
  if (isa == "avx2") return avx2::fmatmul;
#endif
#if defined(__aarch64__)
  if (isa == "neon") return neon::fmatmul;
#endif
  return scalar::fmatmul;
}

void repack_float(const float* w, int n, int k, float* out) {
  const int tiles = n_tiles(n);
  for (int t = 0; t < tiles; ++t) {
    float* tile = out + size_t(t) * k * TILE;
    for (int c = 0; c < TILE; ++c) {
      const int row = t * TILE + c;
      const float* src = row < n ? w + size_t(row) * k : nullptr;
      for (int j = 0; j < k; ++j) tile[size_t(j) * TILE + c] = src ? src[j] : 0.f;
    }
  }
}

void float_rows(const float* packed, int n, int k, const int32_t* ids, int count, float* out) {
  for (int i = 0; i < count; ++i) {
    const int row = ids[i];
    float* y = out + size_t(i) * k;
    if (row < 0 || row >= n) {
      std::memset(y, 0, sizeof(float) * k);
      continue;
    }
    const float* tile = packed + size_t(row / TILE) * k * TILE + row % TILE;
    for (int j = 0; j < k; ++j) y[j] = tile[size_t(j) * TILE];
  }
}

}  // namespace mlxcel_q
