// Scalar readers of the packed layout: per-block parameters and values of one feature.
#include "unit.h"

namespace mlxcel_q {

void block_params(const Layout& l, const uint8_t* unit, int b, int c, float* scale_lo, float* scale_hi, float* mn) {
  float s = 0.f, m = 0.f, s2;
  switch (l.type) {
    case Q4_0: case Q8_0:
      s = half_to_float(load_u16(unit + 2 * c));
      break;
    case Q4_1:
      s = half_to_float(load_u16(unit + 2 * c));
      m = half_to_float(load_u16(unit + 32 + 2 * c));
      break;
    case Q4_K: case Q5_K: {
      float d = half_to_float(load_u16(unit + 2 * c));
      float dmin = half_to_float(load_u16(unit + 32 + 2 * c));
      s = d * float(unit[KQ_SC + b * 16 + c]);
      m = -(dmin * float(unit[KQ_M + b * 16 + c]));
      break;
    }
    case Q6_K: {
      float d = half_to_float(load_u16(unit + 2 * c));
      s = d * float(int8_t(unit[Q6K_SC + (2 * b) * 16 + c]));
      s2 = d * float(int8_t(unit[Q6K_SC + (2 * b + 1) * 16 + c]));
      *scale_lo = s;
      *scale_hi = s2;
      *mn = 0.f;
      return;
    }
    default:
      s = load_f32(unit + 4 * c);
      m = load_f32(unit + 64 + 4 * c);
  }
  *scale_lo = s;
  *scale_hi = s;
  *mn = m;
}

void block_values(const Layout& l, const uint8_t* unit, int b, int c, int* u) {
  const uint8_t* v = unit + values_offset(l) + b * value_block_bytes(l);
  if (value_block_bytes(l) == 512) {
    for (int g = 0; g < 8; ++g)
      for (int j = 0; j < 4; ++j) u[4 * g + j] = v[g * 64 + c * 4 + j];
    return;
  }
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) {
      uint8_t byte = v[n * 64 + c * 4 + j];
      u[8 * n + j] = byte & 0x0f;
      u[8 * n + 4 + j] = byte >> 4;
    }
  if (l.type == Q5_K) {
    const uint8_t* qh = unit + Q5K_QH + b * 64;
    for (int g = 0; g < 8; ++g) {
      uint64_t mask;
      std::memcpy(&mask, qh + 8 * g, 8);
      for (int j = 0; j < 4; ++j) u[4 * g + j] |= int((mask >> (c * 4 + j)) & 1) << 4;
    }
  } else if (l.type == Q6_K) {
    const uint8_t* qh = unit + Q6K_QH + b * 128;
    for (int g = 0; g < 8; ++g) {
      int h = g / 4, t = g % 4;
      for (int j = 0; j < 4; ++j) u[4 * g + j] |= ((qh[h * 64 + c * 4 + j] >> (2 * t)) & 3) << 4;
    }
  }
}

}  // namespace mlxcel_q
