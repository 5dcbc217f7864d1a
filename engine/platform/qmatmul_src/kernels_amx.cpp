// AMX (tiles + int8) for chunks of several rows; fewer rows take the AVX-512 VNNI kernel, compiled
// into this unit from the same body (kernel_body.h).
//
// The packed values of one 32-value block (layout.h) are already a B tile in AMX's layout: 8 rows
// (four inputs each) of 64 bytes (16 features x 4 inputs). For a chunk of R <= 16 rows the
// activations of block kb sit side by side (chunked_rows: [block][row][32]), an A tile of R rows x
// 32 bytes. One tdpbsud (signed activations x unsigned weights) gives every row's 16 integer dot
// products of the block at once, where VNNI spends 8 vpdpbusd per row; the 8-bit types load B
// straight from the packed weight, the 4-bit ones unpack it first (4 loads, 8 ands / shifts, 8
// stores into L1). The integer sums are exact either way, and each row's float epilogue below is
// the VNNI kernel's, operation for operation, so a row gets the same bits from either path,
// whatever the width: the probe's verdicts and the kernel tests hold unchanged.
//
// Measured per call on this kind of CPU (Sapphire Rapids guest, one thread, weights in cache), at 16
// rows: Q4_1 1536 x 576 0.30 -> 0.21-0.25 ms, Q8_0 0.38 -> 0.28-0.31, Q4_K 1536 x 1536 0.61 ->
// 0.48, Q5_K 0.62-0.67 -> 0.49-0.52 (docs/benchmarks.md); at 8 rows even, at 4 slower (the tile loads and the store of C per block cost
// more than 4 rows of vpdpbusd), hence chunks of 8 or more. Q6_K stays on VNNI: its two 16-input
// halves carry their own scales, so each block takes two half-depth products and two stores (16
// rows 0.91 -> 1.25 ms). The per-block store of C and the float epilogue are what remain: the
// scales differ per block, so C cannot accumulate across blocks.
//
// Written by hand because no maintained library multiplies these block formats (a scale and a
// min per 32 values and feature) on the tiles with a row's bits independent of the batch width;
// llama.cpp's AMX code is part of ggml, not a library to link.
#include <immintrin.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cpuid.h>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "unit.h"

namespace mlxcel_q::amx {

#include "v_avx512.h"

#define MAXR_8 1
#define KERNEL_ENTRY matmul_vnni
#include "kernel_body.h"

namespace {

constexpr int AMX_ROWS = 16;  // rows of an A / C tile

// Chunks of at least this many rows take the tiles (MLXCEL_AMX_MIN_ROWS, 2..9; the remainder of
// a width below it goes through the VNNI chunks, which take at most 8 rows).
int min_rows() {
  static const int rows = [] {
    const char* v = std::getenv("MLXCEL_AMX_MIN_ROWS");
    return v ? std::clamp(std::atoi(v), 2, 9) : 8;
  }();
  return rows;
}

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles: C 0, 1 (R rows x 16 int32), A 2, 3 (R rows x 32 activations), B 4, 5 (8 x 64 bytes).
void configure(int R) {
  TileConfig c{};
  c.palette = 1;
  for (int t : {0, 1}) c.rows[t] = uint8_t(R), c.colsb[t] = 64;
  for (int t : {2, 3}) c.rows[t] = uint8_t(R), c.colsb[t] = 32;
  for (int t : {4, 5}) c.rows[t] = 8, c.colsb[t] = 64;
  // Not _tile_loadconfig: GCC 12's declares only the first 8 bytes as read, and the stores of the
  // rows and column widths were dropped as dead (every configuration had zero-size tiles).
  __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

// Per block and feature: w = S * u + M in the scale / min of the VNNI kernel, by the same
// expressions as tile_rows, for the same bits.
struct Params {
  V::vf S, M;
};

template <int T>
inline Params params(const uint8_t* unit, int b, V::vf d, V::vf dmin) {
  using Tr = Traits<T>;
  Params p;
  if constexpr (T == Q4_0 || T == Q8_0) {
    p.S = V::half(unit);
    p.M = V::mul(p.S, V::set1(-float(Tr::offset)));
  } else if constexpr (T == Q4_1) {
    p.S = V::half(unit);
    p.M = V::half(unit + 32);
  } else if constexpr (Tr::kq) {
    p.S = V::mul(d, V::u8f(unit + KQ_SC + b * 16));
    p.M = V::neg(V::mul(dmin, V::u8f(unit + KQ_M + b * 16)));
  } else {
    p.S = V::loadf(unit);
    p.M = V::loadf(unit + 64);
  }
  return p;
}

// The B tile of block b: 8 rows of 64 bytes, from the packed weight (8-bit) or unpacked into wb.
template <int T>
inline const uint8_t* weights(const uint8_t* unit, int b, uint8_t* wb) {
  using Tr = Traits<T>;
  const uint8_t* vals = unit + Tr::values + b * (Tr::eight ? 512 : 256);
  if constexpr (Tr::eight) {
    return vals;
  } else {
    V::vi w[8];
    for (int n = 0; n < 4; ++n) {
      V::vi v = V::load(vals + n * 64);
      w[2 * n] = V::lo_nibble(v);
      w[2 * n + 1] = V::hi_nibble(v);
    }
    if constexpr (T == Q5_K) {
      const uint8_t* qh = unit + Q5K_QH + b * 64;
      for (int g = 0; g < 8; ++g) {
        uint64_t mask;
        std::memcpy(&mask, qh + 8 * g, 8);
        w[g] = V::add16_where(w[g], mask);
      }
    }
    for (int g = 0; g < 8; ++g) _mm512_store_si512(wb + 64 * g, w[g]);
    return wb;
  }
}

template <int P>
using Tile = std::integral_constant<int, P>;

// Rows [r0, r0 + R) of one tile through the tiles (R >= 2), stored into out.
template <int T, int R>
void amx_chunk(const Layout& l, const uint8_t* tile, int units, int n, const XQuant& x, int r0, float* out, int t,
               size_t ahead) {
  using Tr = Traits<T>;
  const int nb = x.blocks();
  const int8_t* xq = x.q + size_t(r0) * x.k;  // this chunk's activations, [block][row][32]
  const size_t xi0 = size_t(r0) * nb;         // index of (row 0, block 0) in d / ds
  const int block_bytes = l.unit_bytes / l.blocks;
  alignas(64) uint8_t wbuf[2][512];
  alignas(64) int32_t cbuf[2][R * 16];
  V::vf acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  const int total = units * l.blocks;
  auto unit_of = [&](int i) { return tile + size_t(i / l.blocks) * l.unit_bytes; };

  // Block i moves through four stages, one step apart, so that no stage waits on the one before:
  // its weights are unpacked into wbuf (4-bit types), loaded into a B tile and multiplied into C
  // tile i % 2, stored to cbuf[i % 2], and applied to the rows' accumulators. A tile load right
  // after the stores it reads, or a vector load right after a tile store, waits for the stores to
  // reach L1 (no forwarding): one step in between hides that.
  const uint8_t* wsrc[2];
  auto prepare = [&](auto parity, int i) __attribute__((always_inline)) {
    constexpr int P = decltype(parity)::value;
    const uint8_t* unit = unit_of(i);
    const int b = i % l.blocks;
    if (ahead) {
      const uint8_t* pf = unit + (ahead & ~PREFETCH_TO_L2) + b * block_bytes;  // into L1 here (tuned so)
      for (int j = 0; j < block_bytes; j += 64) __builtin_prefetch(pf + j);
    }
    wsrc[P] = weights<T>(unit, b, wbuf[P]);
  };

  // (GCC's tile intrinsics paste the tile number into the assembly: literals only)
  auto multiply = [&](auto parity, int i) __attribute__((always_inline)) {
    constexpr int P = decltype(parity)::value;
    const int8_t* a = xq + size_t(i) * R * 32;
    if constexpr (P == 0) {
      _tile_loadd(2, a, 32);
      _tile_loadd(4, wsrc[0], 64);
      _tile_zero(0);
      _tile_dpbsud(0, 2, 4);
    } else {
      _tile_loadd(3, a, 32);
      _tile_loadd(5, wsrc[1], 64);
      _tile_zero(1);
      _tile_dpbsud(1, 3, 5);
    }
  };

  auto store = [&](auto parity) __attribute__((always_inline)) {
    if constexpr (decltype(parity)::value == 0) _tile_stored(0, cbuf[0], 64);
    else _tile_stored(1, cbuf[1], 64);
  };

  // The VNNI kernel's epilogue (tile_rows), row by row, on the stored dot products of block i.
  auto apply = [&](auto parity, int i) __attribute__((always_inline)) {
    constexpr int P = decltype(parity)::value;
    const uint8_t* unit = unit_of(i);
    V::vf d, dmin;
    if constexpr (Tr::kq) d = V::half(unit), dmin = V::half(unit + 32);
    const Params p = params<T>(unit, i % l.blocks, d, dmin);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const size_t xi = xi0 + size_t(i) * R + r;
      const V::vi dot = _mm512_load_si512(cbuf[P] + 16 * r);
      acc[r] = V::fma(V::cvt(dot), V::mul(p.S, V::bcastf(x.d + xi)), acc[r]);
      if constexpr (Tr::has_min || Tr::offset != 0) acc[r] = V::fma(p.M, V::bcastf(x.ds + 3 * xi + 2), acc[r]);
    }
  };

  // Step j: prepare j + 1, multiply j, store j - 1, apply j - 2 (parities alternate).
  auto step = [&](auto parity, auto other, int j) __attribute__((always_inline)) {
    if (j + 1 < total) prepare(other, j + 1);
    if (j < total) multiply(parity, j);
    if (j >= 1 && j - 1 < total) store(other);
    if (j >= 2) apply(parity, j - 2);
  };
  prepare(Tile<0>{}, 0);
  for (int j = 0; j < total + 2; j += 2) {
    step(Tile<0>{}, Tile<1>{}, j);
    if (j + 1 < total + 2) step(Tile<1>{}, Tile<0>{}, j + 1);
  }
  alignas(64) float buf[R * TILE];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) V::storef(buf + r * TILE, acc[r]);
  const int cols = std::min(TILE, n - t * TILE);
  for (int r = 0; r < R; ++r) std::memcpy(out + size_t(r0 + r) * n + t * TILE, buf + r * TILE, sizeof(float) * cols);
}

// The rows of the tile configuration this thread last loaded, -1 for none.
thread_local int g_config = -1;

template <int T>
void amx_rows(const Layout& l, const uint8_t* tile, int units, int n, const XQuant& x, int r0, int rows, float* out,
              int t, size_t ahead) {
  if (rows < min_rows()) return chunk<T>(l, tile, units, n, x, r0, rows, out, t, ahead);
  if (g_config != rows) {
    configure(rows);
    g_config = rows;
  }
  switch (rows) {
#define ROWS(R) \
    case R: amx_chunk<T, R>(l, tile, units, n, x, r0, out, t, ahead); break;
    ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9)
    ROWS(10) ROWS(11) ROWS(12) ROWS(13) ROWS(14) ROWS(15) ROWS(16)
#undef ROWS
  }
}

// matmul_type's walk (kernel_body.h) with chunks of up to 16 rows: the same order over tiles and
// rows, the same prefetch.
template <int T>
void amx_type(const Layout& l, const uint8_t* packed, int n, int k, const XQuant& rows, int m, float* out, int t0,
              int t1) {
  walk<T, AMX_ROWS, amx_rows<T>>(l, packed, n, k, rows, m, out, t0, t1);
  // Leave the tile state unused between calls (a thread holding it saves and restores 8 KB more
  // per context switch).
  if (g_config != -1) {
    _tile_release();
    g_config = -1;
  }
}

// The process asks Linux for the tile data state (granted once for all its threads), and a child
// process runs one product: a guest that advertises AMX without granting it fails there, not here.
bool probe() {
  if (const char* v = std::getenv("MLXCEL_AMX"); v && !std::strcmp(v, "0")) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 25))) return false;  // AMX-TILE, AMX-INT8
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA enabled by the OS
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return false;
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    alignas(64) int8_t A[2][32];
    alignas(64) uint8_t B[8][64];
    alignas(64) int32_t C[2][16];
    for (int r = 0; r < 2; ++r)
      for (int k = 0; k < 32; ++k) A[r][k] = int8_t((r * 37 + k * 11) % 255 - 127);
    for (int g = 0; g < 8; ++g)
      for (int j = 0; j < 64; ++j) B[g][j] = uint8_t(g * 29 + j * 7);
    configure(2);
    _tile_loadd(2, A, 32);
    _tile_loadd(4, B, 64);
    _tile_zero(0);
    _tile_dpbsud(0, 2, 4);
    _tile_stored(0, C, 64);
    _tile_release();
    for (int r = 0; r < 2; ++r)
      for (int f = 0; f < 16; ++f) {
        int32_t want = 0;
        for (int k = 0; k < 32; ++k) want += int32_t(A[r][k]) * int32_t(B[k / 4][f * 4 + k % 4]);
        if (C[r][f] != want) _exit(1);
      }
    _exit(0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

bool usable() {
  static const bool ok = probe();
  return ok;
}

void matmul(const Layout& l, const uint8_t* packed, int n, int k, const XQuant& x, int m, float* out, int t0,
            int t1) {
  if (l.type == Q6_K || m < min_rows()) return matmul_vnni(l, packed, n, k, x, m, out, t0, t1);
  switch (l.type) {
    case Q4_0: amx_type<Q4_0>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q4_1: amx_type<Q4_1>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q8_0: amx_type<Q8_0>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q4_K: amx_type<Q4_K>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q5_K: amx_type<Q5_K>(l, packed, n, k, x, m, out, t0, t1); break;
    case AFFINE4: amx_type<AFFINE4>(l, packed, n, k, x, m, out, t0, t1); break;
    case AFFINE8: amx_type<AFFINE8>(l, packed, n, k, x, m, out, t0, t1); break;
  }
}

}  // namespace mlxcel_q::amx
