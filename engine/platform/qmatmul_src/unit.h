// Byte offsets inside one unit of a tile (see layout.h), and scalar helpers.
#pragma once

#include <cstdint>
#include <cstring>

#include "layout.h"

namespace mlxcel_q {

// Q4_0 / Q4_1 / Q8_0: d (f16 x16) [, m (f16 x16)], values.
// Q4_K / Q5_K: d, dmin (f16 x16), sc[8][16], m[8][16] (u8), values (8 x 256) [, Q5_K high bits 8 x 8 x u64].
// Q6_K: d (f16 x16), sc[16][16] (i8), low nibbles (8 x 256), high bits (8 x 128).
// AFFINE4/8: scale, bias (f32 x16), values.
constexpr int KQ_SC = 64, KQ_M = 192, KQ_QS = 320, Q5K_QH = 2368;
constexpr int Q6K_SC = 32, Q6K_QL = 288, Q6K_QH = 2336;
constexpr int AFF_QS = 128;

inline int values_offset(const Layout& l) {
  switch (l.type) {
    case Q4_0: case Q8_0: return 32;
    case Q4_1: return 64;
    case Q4_K: case Q5_K: return KQ_QS;
    case Q6_K: return Q6K_QL;
    default: return AFF_QS;
  }
}

inline int value_block_bytes(const Layout& l) {
  return (l.type == Q8_0 || l.type == AFFINE8) ? 512 : 256;
}

inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      man &= 0x3ff;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t load_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline float load_f32(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }

}  // namespace mlxcel_q
