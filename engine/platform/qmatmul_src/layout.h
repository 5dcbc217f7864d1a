// Packed weight layout shared by the repacker, the kernels and the row dequantizer.
//
// A weight matrix W[N, K] (N output features, K inputs) is stored as tiles of 16 output
// features. A tile holds ceil(K / unit_k) "units" back to back (a unit is one 32-value block
// for Q4_0/Q4_1/Q8_0, one 256-value super-block for the K-quants, one quantization group for
// MLX's affine format), so a kernel reads a tile front to back exactly once. Inside a unit,
// the per-feature parameters come first (16 of each), then the quantized values of each
// 32-value block, interleaved across the 16 features in groups of four inputs:
//
//   8-bit values:  byte [g * 64 + c * 4 + j]        = u[c][4 g + j]            g = 0..7
//   4-bit values:  byte [n * 64 + c * 4 + j]        = u[c][8 n + j] | u[c][8 n + 4 + j] << 4
//
// so one 64-byte load holds four consecutive inputs of 16 features: the shape a dot-product
// instruction (vpdpbusd, or maddubs + madd) consumes against four broadcast activation bytes,
// with one lane per output feature and no horizontal reduction.
//
// Every value is stored unsigned (u); per 32-block and feature the weight is
//   w = scale_h * (u - offset) + min        (scale_h: one scale for inputs 0..15, one for 16..31)
// Tensor bytes equal the GGUF file's for Q4_0, Q4_1, Q8_0 and Q6_K; Q4_K and Q5_K spend 4 more
// bytes per feature and super-block (6-bit scales unpacked to bytes): +2.8% and +2.3%.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace mlxcel_q {

// ggml type ids for the GGUF formats, 100+ for MLX's affine format.
enum QType : int {
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  AFFINE4 = 104,
  AFFINE8 = 108,
  F32 = 132,  // float32 tiles (fkernel.h): one 64-byte unit per input, no blocks
};

constexpr int TILE = 16;  // output features per tile

struct Layout {
  QType type;
  int group;          // values per unit (inputs)
  int unit_bytes;     // bytes per unit of a tile
  int blocks;         // 32-value blocks per unit
  int offset;         // subtracted from u
  bool has_min;       // whether a per-block min term exists
  bool split_scale;   // scale per 16 inputs (Q6_K)
};

inline Layout layout_of(int type, int group) {
  switch (type) {
    case Q4_0: return {Q4_0, 32, 32 + 256, 1, 8, false, false};
    case Q4_1: return {Q4_1, 32, 64 + 256, 1, 0, true, false};
    case Q8_0: return {Q8_0, 32, 32 + 512, 1, 128, false, false};
    case Q4_K: return {Q4_K, 256, 64 + 256 + 2048, 8, 0, true, false};
    case Q5_K: return {Q5_K, 256, 64 + 256 + 2048 + 512, 8, 0, true, false};
    case Q6_K: return {Q6_K, 256, 32 + 256 + 2048 + 1024, 8, 32, false, true};
    case AFFINE4:
    case AFFINE8: {
      if (group != 32 && group != 64 && group != 128)
        throw std::invalid_argument("affine group size must be 32, 64 or 128");
      int per_block = type == AFFINE4 ? 256 : 512;
      return {QType(type), group, 128 + (group / 32) * per_block, group / 32, 0, true, false};
    }
    case F32: return {F32, 1, 64, 0, 0, false, false};
    default:
      throw std::invalid_argument("unsupported packed type " + std::to_string(type));
  }
}

inline int n_tiles(int n) { return (n + TILE - 1) / TILE; }

inline size_t tile_bytes(const Layout& l, int k) { return size_t(k / l.group) * l.unit_bytes; }

inline size_t packed_bytes(const Layout& l, int n, int k) { return size_t(n_tiles(n)) * tile_bytes(l, k); }

// Activations quantized per row to int8 in blocks of 32 (scale d = max|x| / 127).
struct ChunkedRows;

struct XQuant {
  const int8_t* q;      // [M][K]
  const float* d;       // [M][K/32]
  const int32_t* s;     // [M][K/32][2]: sums of q over inputs 0..15 and 16..31 of each block
  const float* ds;      // [M][K/32][3]: d * (sum over 0..15), d * (sum over 16..31), d * (sum over 0..31)
  int k;
  // A call split among threads shares one re-laid copy of these rows (kernel_body.h, chunked_rows):
  // the first of its pieces to need it lays it out, the others read it. Null: each piece its own.
  ChunkedRows* shared = nullptr;
  int blocks() const { return k / 32; }
};

// One call's activations laid out for chunks of `step` rows, made once for all of its pieces
// (every piece of a split call used to re-lay all M rows for itself: 16 pieces of a 256-row call
// on 2 threads, SmolLM2's 1536 x 576 at 2 threads barely faster than at 1). Filled under `mu` by
// the first piece that asks; a piece wanting another step (a multi-matrix call mixing types) lays
// out its own, as before.
struct ChunkedRows {
  std::mutex mu;
  int step = 0;  // 0: not laid out yet
  std::vector<int8_t> q;
  std::vector<float> d, ds;
  std::vector<int32_t> s;
};

// One ISA's kernel: rows [0, m) of out[M, N] for tiles [t0, t1).
using TileKernel = void (*)(const Layout& l, const uint8_t* packed, int n, int k, const XQuant& x, int m,
                            float* out, int t0, int t1);

namespace scalar { void matmul(const Layout&, const uint8_t*, int, int, const XQuant&, int, float*, int, int); }
#if defined(__x86_64__) || defined(_M_X64)
namespace avx2 { void matmul(const Layout&, const uint8_t*, int, int, const XQuant&, int, float*, int, int); }
namespace avx512 { void matmul(const Layout&, const uint8_t*, int, int, const XQuant&, int, float*, int, int); }
namespace amx {
void matmul(const Layout&, const uint8_t*, int, int, const XQuant&, int, float*, int, int);
bool usable();  // the CPU has AMX-INT8, Linux grants the tile state, and MLXCEL_AMX is not 0
}
#endif
#if defined(__aarch64__)
namespace neon { void matmul(const Layout&, const uint8_t*, int, int, const XQuant&, int, float*, int, int); }
#endif

// Per 32-block parameters of feature c (0..15) of one unit: scale for inputs 0..15 and 16..31, min.
void block_params(const Layout& l, const uint8_t* unit, int block, int c, float* scale_lo, float* scale_hi,
                  float* min);
// The unsigned values u[32] of feature c in block `block` of a unit.
void block_values(const Layout& l, const uint8_t* unit, int block, int c, int* u);

}  // namespace mlxcel_q
