// The matmul kernel, written once over an ISA's vector operations (struct V, defined by the
// translation unit that includes this file inside its own namespace, compiled with that ISA's
// flags). V::L lanes hold L output features; a 16-feature tile is processed as 16 / L slices.
//
// For each tile, rows are taken in chunks of up to V::MAXR with their accumulators in registers;
// each 32-value block of the tile is decoded once per chunk and applied to every row of it. The
// tile (16 features x K inputs, a few KB) stays in L1/L2 between chunks, so the weights stream
// from memory once per call (per 64 rows). Per row the sequence of operations does not depend on how many rows
// the call has, so a row's result is the same bits whatever the width.

template <int T>
struct Traits {
  static constexpr bool eight = (T == Q8_0 || T == AFFINE8);
  static constexpr bool split = (T == Q6_K);
  static constexpr bool kq = (T == Q4_K || T == Q5_K);
  static constexpr bool has_min = (T == Q4_1 || T == Q4_K || T == Q5_K || T == AFFINE4 || T == AFFINE8);
  static constexpr int offset = T == Q4_0 ? 8 : T == Q8_0 ? 128 : T == Q6_K ? 32 : 0;
  static constexpr int values = (T == Q4_0 || T == Q8_0) ? 32 : T == Q4_1 ? 64 : kq ? KQ_QS : T == Q6_K ? Q6K_QL : AFF_QS;
};

// Software prefetch distance in bytes (MLXCEL_QPREFETCH overrides; 0 turns it off).
static inline int prefetch_distance() {
  static const int bytes = [] {
    const char* v = std::getenv("MLXCEL_QPREFETCH");
    return v ? std::atoi(v) : 4096;
  }();
  return bytes;
}

// Which cache the weights' software prefetches fill. A matrix over 1 MB, which streams from memory,
// prefetches into L2 on x86 (prefetcht2): into L1 (prefetcht0) each line held one of the core's few
// L1 miss buffers from the prefetch to the load, which capped a one-row product's read at 12-15
// GB/s on Zen 4 against 24 for a plain streaming read (Q6_K 8960 x 1536 at one row 0.91 -> 0.59
// ms, Q4_K 1536 x 8960 0.63 -> 0.46, median of 5 rounds; Qwen2.5-1.5B's forward over 2 / 4 tokens
// 65.5 / 85.2 -> 48.0 / 61.5 ms; docs/benchmarks.md). A smaller matrix, which may stay in L2 / L3,
// keeps L1: with L2 there too SmolLM2's forward over 16 tokens went 26.3 -> 29.9 ms.
// MLXCEL_QPREFETCH_L1=1 takes L1 everywhere (the Intel AMX guest was tuned with it); arm64 keeps
// L1 (not measured there). The choice travels in bit 0 of `ahead` (PREFETCH_TO_L2), which is
// otherwise even (unit sizes are).
constexpr size_t PREFETCH_TO_L2 = 1;

static inline bool prefetch_into_l1() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool l1 = [] {
    const char* v = std::getenv("MLXCEL_QPREFETCH_L1");
    return v && std::atoi(v) != 0;
  }();
  return l1;
#else
  return true;
#endif
}

// The row loops are unrolled explicitly: left to the late unroller, GCC kept the R accumulators in
// memory (a store and a reload per row and block; Q4_K 8960 x 1536 at 16 rows 1.20 -> 1.10 ms).
// ahead: how far ahead (bytes) to prefetch the weights, 0 for not at all (see matmul_type).
template <int T, int R>
static void tile_rows(const Layout& l, const uint8_t* tile, int units, const XQuant& x, int r0, int slice,
                      float* out, int ldo, size_t ahead) {
  using Tr = Traits<T>;
  const int nb = x.blocks();
  const int K = x.k;
  const int lane0 = slice * V::L;  // first feature of this slice inside the tile
  const bool l2 = ahead & PREFETCH_TO_L2;
  ahead &= ~PREFETCH_TO_L2;
  typename V::vf acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = V::zero();
  for (int un = 0; un < units; ++un) {
    const uint8_t* unit = tile + size_t(un) * l.unit_bytes;
    typename V::vf d, dmin;
    if constexpr (Tr::kq || T == Q6_K) d = V::half(unit + 2 * lane0);
    if constexpr (Tr::kq) dmin = V::half(unit + 32 + 2 * lane0);
    const int block_bytes = l.unit_bytes / l.blocks;
    for (int b = 0; b < l.blocks; ++b) {
      // With the hardware streamers alone Q6_K read at 8 GB/s here (three streams per unit), and the
      // head (49152 x 576 Q8_0) at 8 rows took 2.77 ms, 1.2 with this: see matmul_type.
      if (ahead && slice == 0) {
        const uint8_t* pf = unit + ahead + b * block_bytes;
        if (l2)
          for (int i = 0; i < block_bytes; i += 64) __builtin_prefetch(pf + i, 0, 1);
        else
          for (int i = 0; i < block_bytes; i += 64) __builtin_prefetch(pf + i, 0, 3);
      }
      const uint8_t* vals = unit + Tr::values + b * (Tr::eight ? 512 : 256) + lane0 * 4;
      typename V::vi w[8];
      if constexpr (Tr::eight) {
        for (int g = 0; g < 8; ++g) w[g] = V::load(vals + g * 64);
      } else {
        for (int n = 0; n < 4; ++n) {
          typename V::vi v = V::load(vals + n * 64);
          w[2 * n] = V::lo_nibble(v);
          w[2 * n + 1] = V::hi_nibble(v);
        }
      }
      if constexpr (T == Q5_K) {
        const uint8_t* qh = unit + Q5K_QH + b * 64;
        for (int g = 0; g < 8; ++g) {
          uint64_t mask;
          std::memcpy(&mask, qh + 8 * g, 8);
          w[g] = V::add16_where(w[g], mask >> (lane0 * 4));
        }
      }
      if constexpr (T == Q6_K) {
        const uint8_t* qh = unit + Q6K_QH + b * 128 + lane0 * 4;
        typename V::vi h0 = V::load(qh), h1 = V::load(qh + 64);
        w[0] = V::or_high2<0>(w[0], h0); w[1] = V::or_high2<1>(w[1], h0);
        w[2] = V::or_high2<2>(w[2], h0); w[3] = V::or_high2<3>(w[3], h0);
        w[4] = V::or_high2<0>(w[4], h1); w[5] = V::or_high2<1>(w[5], h1);
        w[6] = V::or_high2<2>(w[6], h1); w[7] = V::or_high2<3>(w[7], h1);
      }
      // Q4_0 / Q8_0 fold the offset (u - offset) into the min term, M = -offset * scale; Q6_K
      // subtracts it in the integer sums (the row loop below).
      typename V::vf S, S2, M;
      if constexpr (T == Q4_0 || T == Q8_0) {
        S = V::half(unit + 2 * lane0);
        M = V::mul(S, V::set1(-float(Tr::offset)));
      } else if constexpr (T == Q4_1) {
        S = V::half(unit + 2 * lane0);
        M = V::half(unit + 32 + 2 * lane0);
      } else if constexpr (Tr::kq) {
        S = V::mul(d, V::u8f(unit + KQ_SC + b * 16 + lane0));
        M = V::neg(V::mul(dmin, V::u8f(unit + KQ_M + b * 16 + lane0)));
      } else if constexpr (T == Q6_K) {
        S = V::mul(d, V::i8f(unit + Q6K_SC + (2 * b) * 16 + lane0));
        S2 = V::mul(d, V::i8f(unit + Q6K_SC + (2 * b + 1) * 16 + lane0));
      } else {
        S = V::loadf(unit + 4 * lane0);
        M = V::loadf(unit + 64 + 4 * lane0);
      }
      const int kb = un * l.blocks + b;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        // x is laid out chunk by chunk (see chunked_rows): this chunk's rows of block kb side by side
        const size_t xi = size_t(r0) * nb + size_t(kb) * R + r;
        const int8_t* xr = x.q + size_t(r0) * K + (size_t(kb) * R + r) * 32;
        const float* dx = x.d + xi;  // broadcast from memory
        const float* ds = x.ds + 3 * xi;
        if constexpr (Tr::split) {
          typename V::vi lo = V::izero(), hi = V::izero();
          for (int g = 0; g < 4; ++g) {
            lo = V::dot(lo, w[g], xr + 4 * g);
            hi = V::dot(hi, w[g + 4], xr + 4 * g + 16);
          }
          // The offset in the integers: sum (u - 32) q = sum u q - 32 sum q, exact, where a float
          // min term per half cost two more multiplies per block and two FMAs per row and block.
          lo = V::sub_i(lo, Tr::offset * x.s[2 * xi]);
          hi = V::sub_i(hi, Tr::offset * x.s[2 * xi + 1]);
          acc[r] = V::fma(V::cvt(lo), V::mul(S, V::bcastf(dx)), acc[r]);
          acc[r] = V::fma(V::cvt(hi), V::mul(S2, V::bcastf(dx)), acc[r]);
        } else {
          // two independent chains (even and odd groups): half the dependency latency
          typename V::vi d0 = V::izero(), d1 = V::izero();
          for (int g = 0; g < 8; g += 2) {
            if constexpr (Tr::eight) {
              d0 = V::dot8(d0, w[g], xr + 4 * g);
              d1 = V::dot8(d1, w[g + 1], xr + 4 * g + 4);
            } else {
              d0 = V::dot(d0, w[g], xr + 4 * g);
              d1 = V::dot(d1, w[g + 1], xr + 4 * g + 4);
            }
          }
          typename V::vi dot = V::add_i(d0, d1);
          if constexpr (Tr::eight) dot = V::fix8(dot, x.s[2 * xi] + x.s[2 * xi + 1]);
          acc[r] = V::fma(V::cvt(dot), V::mul(S, V::bcastf(dx)), acc[r]);
          if constexpr (Tr::has_min || Tr::offset != 0) acc[r] = V::fma(M, V::bcastf(ds + 2), acc[r]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) V::storef(out + size_t(r) * ldo + lane0, acc[r]);
}

// Rows [r0, r0 + R) of one tile: all its 16 / L slices, then stored.
template <int T, int R>
static void tile_chunk(const Layout& l, const uint8_t* tile, int units, int n, const XQuant& x, int r0, float* out,
                       int t, size_t ahead) {
  alignas(64) float buf[R * TILE];
  for (int slice = 0; slice < TILE / V::L; ++slice) tile_rows<T, R>(l, tile, units, x, r0, slice, buf, TILE, ahead);
  const int cols = std::min(TILE, n - t * TILE);
  for (int r = 0; r < R; ++r) std::memcpy(out + size_t(r0 + r) * n + t * TILE, buf + r * TILE, sizeof(float) * cols);
}

// Rows are taken in blocks of up to ROW_BLOCK (their int8 activations stay in L2). A matrix that
// does not fit in L2 (the head, a 1.5B model's MLP) is walked tile by tile, each tile read from
// memory once and applied to every chunk of V::MAXR rows while it sits in L1: up to ROW_BLOCK rows
// cost one pass over memory, not one per chunk (49152 x 576 Q8_0 at 16 rows: 7.2 -> 5.8 ms). A
// smaller one is walked chunk by chunk over all its tiles (faster while it stays in L2: 1536 x 576
// Q4_1 at 16 rows 0.13 ms, tile by tile 0.16). Either way a row sees the same operations.
constexpr int ROW_BLOCK = 64;
constexpr size_t TILE_ORDER_BYTES = size_t(1) << 20;

// Rows per chunk: V::MAXR for the K-quants, at most BLOCK_TYPE_ROWS for the 32-value block types
// (an ISA may define it lower). AVX-512 once kept the block types at chunks of 4 (8 was slower for
// SmolLM2's Q4_1 / Q8_0); with the accumulators in registers and the next-tile prefetch below, 8
// is faster on Zen 5 (the head at 16 rows 4.3 -> 2.3 ms; docs/benchmarks.md, seventh pass). On Zen 4
// 4 and 8 measured the same (a forward over 16 tokens 28.5 / 27.6 ms). The chunking never changes a row's
// operations.
#ifndef BLOCK_TYPE_ROWS
#define BLOCK_TYPE_ROWS V::MAXR
#endif
template <int T>
constexpr bool wide_chunks = Traits<T>::kq || T == Q6_K || BLOCK_TYPE_ROWS >= V::MAXR;

template <int T>
static void chunk(const Layout& l, const uint8_t* tile, int units, int n, const XQuant& x, int r0, int rows,
                  float* out, int t, size_t ahead) {
  switch (rows) {
    case 1: tile_chunk<T, 1>(l, tile, units, n, x, r0, out, t, ahead); break;
    case 2: tile_chunk<T, 2>(l, tile, units, n, x, r0, out, t, ahead); break;
    case 3: tile_chunk<T, 3>(l, tile, units, n, x, r0, out, t, ahead); break;
    case 4: tile_chunk<T, 4>(l, tile, units, n, x, r0, out, t, ahead); break;
#if MAXR_8
    // only instantiated where used (extra instantiations changed the 4-row code's speed)
    case 5: if constexpr (wide_chunks<T>) tile_chunk<T, 5>(l, tile, units, n, x, r0, out, t, ahead); break;
    case 6: if constexpr (wide_chunks<T>) tile_chunk<T, 6>(l, tile, units, n, x, r0, out, t, ahead); break;
    case 7: if constexpr (wide_chunks<T>) tile_chunk<T, 7>(l, tile, units, n, x, r0, out, t, ahead); break;
    case 8: if constexpr (wide_chunks<T>) tile_chunk<T, 8>(l, tile, units, n, x, r0, out, t, ahead); break;
#endif
  }
}

// The activations re-laid for the kernel: rows [r0, r0 + R) of each chunk (the chunks matmul_type
// cuts) stored block by block, [block][row][32] (and d, s, ds likewise), so that a chunk's rows of
// one block are adjacent: one pointer and immediate offsets in the row loop instead of R pointers a
// row apart (GPR spills). The same values in other places: no row's result changes. For one row
// the layout is the given one. Q4_1 1536 x 576 at 64 rows 0.255 -> 0.226 ms, the head 9.6 -> 8.2.
static void lay_out_chunks(const XQuant& x, int m, int step, std::vector<int8_t>& q, std::vector<float>& d,
                           std::vector<int32_t>& s, std::vector<float>& ds) {
  const int k = x.k, nb = x.blocks();
  q.resize(size_t(m) * k), d.resize(size_t(m) * nb), s.resize(size_t(m) * nb * 2), ds.resize(size_t(m) * nb * 3);
  for (int b0 = 0; b0 < m; b0 += ROW_BLOCK) {
    const int b1 = std::min(m, b0 + ROW_BLOCK);
    for (int r0 = b0; r0 < b1; r0 += step) {
      const int R = std::min(step, b1 - r0);
      for (int r = 0; r < R; ++r)
        for (int kb = 0; kb < nb; ++kb) {
          const size_t from = size_t(r0 + r) * nb + kb, to = size_t(r0) * nb + size_t(kb) * R + r;
          std::memcpy(&q[to * 32], x.q + from * 32, 32);
          d[to] = x.d[from];
          s[2 * to] = x.s[2 * from], s[2 * to + 1] = x.s[2 * from + 1];
          for (int j = 0; j < 3; ++j) ds[3 * to + j] = x.ds[3 * from + j];
        }
    }
  }
}

// The call's shared copy (XQuant::shared) when it is laid out for `step` or can still be, else this
// thread's own copy.
static XQuant chunked_rows(const XQuant& x, int m, int step) {
  if (ChunkedRows* c = x.shared) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->step == 0) {
      lay_out_chunks(x, m, step, c->q, c->d, c->s, c->ds);
      c->step = step;
    }
    if (c->step == step) return XQuant{c->q.data(), c->d.data(), c->s.data(), c->ds.data(), x.k};
  }
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<float> d, ds;
  static thread_local std::vector<int32_t> s;
  lay_out_chunks(x, m, step, q, d, s, ds);
  return XQuant{q.data(), d.data(), s.data(), ds.data(), x.k};
}

// One row through the two-row code, its second row a copy of the first, and stored once. On Zen 4
// the one-row code read its weights slower than the two-row code read the same weights for two
// rows: the 151936 x 1536 Q6_K head 9.0 ms at one row, 7.4 at two, Q4_K 8960 x 1536 0.43 and
// 0.37 ms; one row as a pair took 7.3-7.9 and 0.32-0.38 (three alternating rounds, streamed from
// memory). A row's operations do not depend on the chunk's width, so its bits are the one-row
// code's. Why was not found. Only for a matrix over 1 MB, which streams from memory: there the
// copy's compute is free while the read is the bound.
#ifndef ONE_ROW_AS_PAIR
#define ONE_ROW_AS_PAIR 0
#endif
template <int T>
static void one_row_as_pair(const Layout& l, const uint8_t* packed, int n, int k, const XQuant& x, float* out,
                            int t0, int t1, size_t ahead) {
  const size_t nb = x.blocks();
  static thread_local std::vector<int8_t> q;  // the row twice, laid out as two rows by chunked_rows
  static thread_local std::vector<float> d, ds;
  static thread_local std::vector<int32_t> s;
  q.resize(2 * size_t(k)), d.resize(2 * nb), s.resize(4 * nb), ds.resize(6 * nb);
  for (int r = 0; r < 2; ++r) {
    std::memcpy(q.data() + r * size_t(k), x.q, size_t(k));
    std::memcpy(d.data() + r * nb, x.d, nb * sizeof(float));
    std::memcpy(s.data() + r * 2 * nb, x.s, 2 * nb * sizeof(int32_t));
    std::memcpy(ds.data() + r * 3 * nb, x.ds, 3 * nb * sizeof(float));
  }
  const XQuant pair = chunked_rows(XQuant{q.data(), d.data(), s.data(), ds.data(), k}, 2, 2);
  const size_t tb = tile_bytes(l, k);
  const int units = k / l.group;
  alignas(64) float buf[2 * TILE];
  for (int t = t0; t < t1; ++t) {
    for (int slice = 0; slice < TILE / V::L; ++slice)
      tile_rows<T, 2>(l, packed + size_t(t) * tb, units, pair, 0, slice, buf, TILE, ahead);
    std::memcpy(out + t * TILE, buf, sizeof(float) * std::min(TILE, n - t * TILE));
  }
}

// Rows [r0, r0 + rows) of one tile into out (chunk, or another unit's chunk of its own).
using ChunkFn = void (*)(const Layout&, const uint8_t*, int, int, const XQuant&, int, int, float*, int, size_t);

// The walk over blocks of rows, tiles and chunks of STEP rows, each chunk computed by CHUNK (the
// activations laid out for chunks of STEP, see chunked_rows).
template <int T, int STEP, ChunkFn CHUNK>
static void walk(const Layout& l, const uint8_t* packed, int n, int k, const XQuant& rows, int m, float* out, int t0,
                 int t1) {
  const size_t tb = tile_bytes(l, k);
  const int units = k / l.group;
  const bool by_tile = tb * size_t(t1 - t0) > TILE_ORDER_BYTES;
  const XQuant x = m > 1 ? chunked_rows(rows, m, STEP) : rows;
  // Software prefetch: the first chunk of rows to meet a tile fetches the next tile (tb bytes on),
  // so the read runs a whole tile's compute ahead, and later chunks of the same tile issue nothing
  // (their tile is in L1 / L2), except the K-quants' short distance in the chunk-by-chunk walk.
  // With a fixed 4 KB ahead in every chunk the later chunks left memory idle and the first one
  // waited: 49152 x 576 Q8_0 at 16 rows 2.45 -> 2.1 ms, 8960 x 1536 Q4_K 0.92 -> 0.84 ms, and at
  // 1 row 0.76 -> 0.63 ms and 0.20 -> 0.16 ms.
  const size_t dist = size_t(std::max(0, prefetch_distance()));
  const size_t next = dist ? tb : 0;
  const size_t later = Traits<T>::kq || T == Q6_K ? dist & ~PREFETCH_TO_L2 : 0;
  // L2 for a matrix over TILE_ORDER_BYTES as a whole, whatever this thread's share of it (with two
  // threads Qwen's 1536 x 1536 halves walk chunk by chunk, from memory all the same).
  const bool big = tb * size_t(n_tiles(n)) > TILE_ORDER_BYTES;
  const size_t streamed = next && big && !prefetch_into_l1() ? next | PREFETCH_TO_L2 : next;
  if (ONE_ROW_AS_PAIR && m == 1 && big) return one_row_as_pair<T>(l, packed, n, k, rows, out, t0, t1, streamed);
  for (int b0 = 0; b0 < m; b0 += ROW_BLOCK) {
    const int b1 = std::min(m, b0 + ROW_BLOCK);
    if (by_tile) {
      for (int t = t0; t < t1; ++t)
        for (int r0 = b0; r0 < b1; r0 += STEP)
          CHUNK(l, packed + size_t(t) * tb, units, n, x, r0, std::min(STEP, b1 - r0), out, t, r0 == b0 ? streamed : 0);
    } else {
      for (int r0 = b0; r0 < b1; r0 += STEP)
        for (int t = t0; t < t1; ++t)
          CHUNK(l, packed + size_t(t) * tb, units, n, x, r0, std::min(STEP, b1 - r0), out, t,
                r0 == b0 ? streamed : later);
    }
  }
}

template <int T>
static void matmul_type(const Layout& l, const uint8_t* packed, int n, int k, const XQuant& rows, int m, float* out,
                        int t0, int t1) {
  constexpr int step = wide_chunks<T> ? V::MAXR : std::min(V::MAXR, BLOCK_TYPE_ROWS);
  walk<T, step, chunk<T>>(l, packed, n, k, rows, m, out, t0, t1);
}

// The entry point's name: `matmul` unless the including unit wants it under another (kernels_amx.cpp
// calls this one for its narrow products).
#ifndef KERNEL_ENTRY
#define KERNEL_ENTRY matmul
#endif
void KERNEL_ENTRY(const Layout& l, const uint8_t* packed, int n, int k, const XQuant& x, int m, float* out, int t0,
                  int t1) {
  switch (l.type) {
    case Q4_0: matmul_type<Q4_0>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q4_1: matmul_type<Q4_1>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q8_0: matmul_type<Q8_0>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q4_K: matmul_type<Q4_K>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q5_K: matmul_type<Q5_K>(l, packed, n, k, x, m, out, t0, t1); break;
    case Q6_K: matmul_type<Q6_K>(l, packed, n, k, x, m, out, t0, t1); break;
    case AFFINE4: matmul_type<AFFINE4>(l, packed, n, k, x, m, out, t0, t1); break;
    case AFFINE8: matmul_type<AFFINE8>(l, packed, n, k, x, m, out, t0, t1); break;
  }
}
