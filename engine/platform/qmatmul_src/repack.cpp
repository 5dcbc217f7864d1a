// GGUF blocks and MLX affine matrices into the tiled layout of layout.h. Exact: every stored
// value and scale is the file's own (f16 scales stay f16 bits; 6-bit K-quant scales are unpacked
// to bytes; MLX scales and biases are stored as float32, which holds f16/bf16/f32 exactly).
#include <cstring>
#include <vector>

#include "repack.h"
#include "unit.h"

namespace mlxcel_q {
namespace {

void put_values(const Layout& l, uint8_t* unit, int b, int c, const int* u) {
  uint8_t* v = unit + values_offset(l) + b * value_block_bytes(l);
  if (value_block_bytes(l) == 512) {
    for (int g = 0; g < 8; ++g)
      for (int j = 0; j < 4; ++j) v[g * 64 + c * 4 + j] = uint8_t(u[4 * g + j]);
    return;
  }
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j)
      v[n * 64 + c * 4 + j] = uint8_t((u[8 * n + j] & 0x0f) | ((u[8 * n + 4 + j] & 0x0f) << 4));
  if (l.type == Q5_K) {
    uint8_t* qh = unit + Q5K_QH + b * 64;
    for (int g = 0; g < 8; ++g) {
      uint64_t mask;
      std::memcpy(&mask, qh + 8 * g, 8);
      for (int j = 0; j < 4; ++j)
        if (u[4 * g + j] & 16) mask |= uint64_t(1) << (c * 4 + j);
      std::memcpy(qh + 8 * g, &mask, 8);
    }
  } else if (l.type == Q6_K) {
    uint8_t* qh = unit + Q6K_QH + b * 128;
    for (int g = 0; g < 8; ++g) {
      int h = g / 4, t = g % 4;
      for (int j = 0; j < 4; ++j) qh[h * 64 + c * 4 + j] |= uint8_t(((u[4 * g + j] >> 4) & 3) << (2 * t));
    }
  }
}

void put_half(uint8_t* unit, int at, int c, const uint8_t* src) { std::memcpy(unit + at + 2 * c, src, 2); }

void scale_min_k4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One GGUF unit (a block, or a 256-value super-block) of one feature into `unit`.
void repack_unit(const Layout& l, const uint8_t* src, uint8_t* unit, int c) {
  int u[256];
  switch (l.type) {
    case Q4_0: case Q4_1: {
      put_half(unit, 0, c, src);
      const uint8_t* qs = src + 2;
      if (l.type == Q4_1) {
        put_half(unit, 32, c, src + 2);
        qs = src + 4;
      }
      for (int j = 0; j < 16; ++j) {
        u[j] = qs[j] & 0x0f;
        u[j + 16] = qs[j] >> 4;
      }
      put_values(l, unit, 0, c, u);
      return;
    }
    case Q8_0:
      put_half(unit, 0, c, src);
      for (int j = 0; j < 32; ++j) u[j] = int(int8_t(src[2 + j])) + 128;
      put_values(l, unit, 0, c, u);
      return;
    case Q4_K: case Q5_K: {
      put_half(unit, 0, c, src);
      put_half(unit, 32, c, src + 2);
      const uint8_t* scales = src + 4;
      for (int s = 0; s < 8; ++s) {
        int d, m;
        scale_min_k4(s, scales, &d, &m);
        unit[KQ_SC + s * 16 + c] = uint8_t(d);
        unit[KQ_M + s * 16 + c] = uint8_t(m);
      }
      const uint8_t* qh = src + 16;  // Q5_K only
      const uint8_t* ql = l.type == Q4_K ? src + 16 : src + 48;
      for (int jj = 0; jj < 4; ++jj) {
        for (int i = 0; i < 32; ++i) {
          u[64 * jj + i] = ql[32 * jj + i] & 0x0f;
          u[64 * jj + 32 + i] = ql[32 * jj + i] >> 4;
          if (l.type == Q5_K) {
            u[64 * jj + i] |= ((qh[i] >> (2 * jj)) & 1) << 4;
            u[64 * jj + 32 + i] |= ((qh[i] >> (2 * jj + 1)) & 1) << 4;
          }
        }
      }
      for (int b = 0; b < 8; ++b) put_values(l, unit, b, c, u + 32 * b);
      return;
    }
    case Q6_K: {
      const uint8_t* ql = src;
      const uint8_t* qh = src + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
      put_half(unit, 0, c, src + 208);
      for (int s = 0; s < 16; ++s) unit[Q6K_SC + s * 16 + c] = uint8_t(sc[s]);
      for (int nn = 0; nn < 2; ++nn) {
        const uint8_t* a = ql + 64 * nn;
        const uint8_t* h = qh + 32 * nn;
        for (int i = 0; i < 32; ++i) {
          u[128 * nn + i] = (a[i] & 0xf) | (((h[i] >> 0) & 3) << 4);
          u[128 * nn + 32 + i] = (a[i + 32] & 0xf) | (((h[i] >> 2) & 3) << 4);
          u[128 * nn + 64 + i] = (a[i] >> 4) | (((h[i] >> 4) & 3) << 4);
          u[128 * nn + 96 + i] = (a[i + 32] >> 4) | (((h[i] >> 6) & 3) << 4);
        }
      }
      for (int b = 0; b < 8; ++b) put_values(l, unit, b, c, u + 32 * b);
      return;
    }
    default:
      throw std::invalid_argument("not a GGUF block type");
  }
}

int gguf_unit_bytes(int type) {
  switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: throw std::invalid_argument("not a GGUF block type");
  }
}

}  // namespace

size_t gguf_row_bytes(int type, int k) {
  Layout l = layout_of(type, 0);
  return size_t(k / l.group) * gguf_unit_bytes(type);
}

void repack_gguf(int type, const uint8_t* raw, int n, int k, uint8_t* out) {
  Layout l = layout_of(type, 0);
  if (k % l.group) throw std::invalid_argument("row length is not a multiple of the block size");
  size_t row_bytes = gguf_row_bytes(type, k);
  int units = k / l.group;
  size_t tb = tile_bytes(l, k);
  std::memset(out, 0, packed_bytes(l, n, k));
  for (int t = 0; t < n_tiles(n); ++t)
    for (int c = 0; c < TILE && t * TILE + c < n; ++c) {
      const uint8_t* row = raw + size_t(t * TILE + c) * row_bytes;
      for (int un = 0; un < units; ++un)
        repack_unit(l, row + size_t(un) * gguf_unit_bytes(type), out + t * tb + size_t(un) * l.unit_bytes, c);
    }
}

void repack_affine(int bits, int group, const uint32_t* w, const float* scales, const float* biases, int n, int k,
                   uint8_t* out) {
  Layout l = layout_of(bits == 4 ? AFFINE4 : AFFINE8, group);
  if (k % group) throw std::invalid_argument("row length is not a multiple of the group size");
  int units = k / group;
  size_t tb = tile_bytes(l, k);
  size_t words = size_t(k) * bits / 32;
  std::memset(out, 0, packed_bytes(l, n, k));
  int u[32];
  for (int t = 0; t < n_tiles(n); ++t)
    for (int c = 0; c < TILE && t * TILE + c < n; ++c) {
      size_t row = size_t(t * TILE + c);
      const uint32_t* wr = w + row * words;
      for (int un = 0; un < units; ++un) {
        uint8_t* unit = out + t * tb + size_t(un) * l.unit_bytes;
        std::memcpy(unit + 4 * c, scales + row * units + un, 4);
        std::memcpy(unit + 64 + 4 * c, biases + row * units + un, 4);
        for (int b = 0; b < l.blocks; ++b) {
          for (int j = 0; j < 32; ++j) {
            size_t e = size_t(un) * group + b * 32 + j;
            u[j] = bits == 4 ? int((wr[e / 8] >> (4 * (e % 8))) & 0xf) : int((wr[e / 4] >> (8 * (e % 4))) & 0xff);
          }
          put_values(l, unit, b, c, u);
        }
      }
    }
}

void dequantize_rows(const Layout& l, const uint8_t* packed, int n, int k, const int32_t* ids, int count,
                     float* out) {
  size_t tb = tile_bytes(l, k);
  int units = k / l.group;
  int u[32];
  for (int i = 0; i < count; ++i) {
    int row = ids[i];
    float* y = out + size_t(i) * k;
    if (row < 0 || row >= n) {
      std::memset(y, 0, sizeof(float) * k);
      continue;
    }
    const uint8_t* tile = packed + size_t(row / TILE) * tb;
    int c = row % TILE;
    for (int un = 0; un < units; ++un) {
      const uint8_t* unit = tile + size_t(un) * l.unit_bytes;
      for (int b = 0; b < l.blocks; ++b) {
        float slo, shi, mn;
        block_params(l, unit, b, c, &slo, &shi, &mn);
        block_values(l, unit, b, c, u);
        float* yb = y + size_t(un) * l.group + b * 32;
        for (int j = 0; j < 32; ++j) yb[j] = (j < 16 ? slo : shi) * float(u[j] - l.offset) + mn;
      }
    }
  }
}

}  // namespace mlxcel_q
