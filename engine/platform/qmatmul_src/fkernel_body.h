// The float kernel (fkernel.h), written once over an ISA's vector operations (struct FV, defined
// by the translation unit including this inside its namespace, compiled with that ISA's flags).
// FV::L lanes hold L features, a tile is S = 16 / L slices; FV::TT tiles are taken at once (more
// independent accumulators for few rows, each input's broadcast shared by them), rows in chunks
// of up to FV::MAXR with the accumulators in registers. The tiles (64 * k bytes each) stay in
// L1/L2 between row chunks, so the weights stream from memory once per call.

static constexpr int FS = 16 / FV::L;

// Software prefetch distance in bytes along each tile (MLXCEL_FPREFETCH overrides; 0 turns it off):
// with two tiles streamed at once and several rows of work per input, the hardware streamers
// alone fell behind (see docs/benchmarks.md).
static inline int fprefetch_bytes() {
  static const int bytes = [] {
    const char* v = std::getenv("MLXCEL_FPREFETCH");
    return v ? std::atoi(v) : 4096;
  }();
  return bytes;
}

template <int R, int TT>
static void ftiles(const float* tile, int K, const float* x, int ldx, float* out, int ldo, int valid) {
  typename FV::vf acc[TT][FS][R];
  for (int t = 0; t < TT; ++t)
    for (int s = 0; s < FS; ++s)
      for (int r = 0; r < R; ++r) acc[t][s][r] = FV::zero();
  const size_t tstride = size_t(K) * 16;
  const int pf = fprefetch_bytes() / 4;  // in floats
  for (int k = 0; k < K; ++k) {
    if (pf > 0)  // one 64-byte line per tile and input
      for (int t = 0; t < TT; ++t) __builtin_prefetch(tile + t * tstride + size_t(k) * 16 + pf);
    typename FV::vf w[TT][FS];
    for (int t = 0; t < TT; ++t)
      for (int s = 0; s < FS; ++s) w[t][s] = FV::load(tile + t * tstride + size_t(k) * 16 + s * FV::L);
    for (int r = 0; r < R; ++r) {
      const typename FV::vf b = FV::bcast(x + size_t(r) * ldx + k);
      for (int t = 0; t < TT; ++t)
        for (int s = 0; s < FS; ++s) acc[t][s][r] = FV::fma(w[t][s], b, acc[t][s][r]);
    }
  }
  // valid: output features of this group of tiles inside n (16 * TT unless it holds the last one)
  for (int r = 0; r < R; ++r) {
    float* o = out + size_t(r) * ldo;
    if (valid == 16 * TT) {
      for (int t = 0; t < TT; ++t)
        for (int s = 0; s < FS; ++s) FV::store(o + t * 16 + s * FV::L, acc[t][s][r]);
    } else {
      alignas(64) float tmp[16 * TT];
      for (int t = 0; t < TT; ++t)
        for (int s = 0; s < FS; ++s) FV::store(tmp + t * 16 + s * FV::L, acc[t][s][r]);
      for (int c = 0; c < valid; ++c) o[c] = tmp[c];
    }
  }
}

template <int TT>
static void frows(const float* tile, int K, const float* x, int m, float* out, int ldo, int valid) {
  for (int r0 = 0; r0 < m; r0 += FV::MAXR) {
    const int R = std::min(FV::MAXR, m - r0);
    const float* xr = x + size_t(r0) * K;
    float* o = out + size_t(r0) * ldo;
    switch (R) {
#define MLXCEL_FROWS(n) case n: if constexpr (n <= FV::MAXR) ftiles<n, TT>(tile, K, xr, K, o, ldo, valid); break;
      MLXCEL_FROWS(1) MLXCEL_FROWS(2) MLXCEL_FROWS(3) MLXCEL_FROWS(4) MLXCEL_FROWS(5) MLXCEL_FROWS(6)
      MLXCEL_FROWS(7) MLXCEL_FROWS(8) MLXCEL_FROWS(9) MLXCEL_FROWS(10) MLXCEL_FROWS(11) MLXCEL_FROWS(12)
#undef MLXCEL_FROWS
      default: break;
    }
  }
}

void fmatmul(const float* packed, int n, int k, const float* x, int m, float* out, int t0, int t1) {
  const size_t tstride = size_t(k) * 16;
  int t = t0;
  for (; t + FV::TT <= t1; t += FV::TT) {
    const int valid = std::min(16 * FV::TT, n - 16 * t);
    frows<FV::TT>(packed + t * tstride, k, x, m, out + 16 * t, n, valid);
  }
  for (; t < t1; ++t) frows<1>(packed + t * tstride, k, x, m, out + 16 * t, n, std::min(16, n - 16 * t));
}
