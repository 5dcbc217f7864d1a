// Standalone check of one ISA kernel (quantized and float32 tiles) against the portable one (bitwise), no MLX needed; scripts/qmatmul_isa_check.sh builds it for arm64 and runs it under qemu.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "fkernel.h"
#include "layout.h"
#include "repack.h"
using namespace mlxcel_q;
static uint16_t f2h(float f) {  // small normal values only
  uint32_t b; std::memcpy(&b, &f, 4);
  uint32_t s = (b >> 16) & 0x8000; int e = int((b >> 23) & 0xff) - 127 + 15; uint32_t m = (b >> 13) & 0x3ff;
  if (e <= 0) return uint16_t(s); return uint16_t(s | (e << 10) | m);
}
int main() {
  std::mt19937 rng(1);
  struct T { int type, unit, bytes; std::vector<int> halfs; };
  std::vector<T> types = {{Q4_0, 32, 18, {0}}, {Q4_1, 32, 20, {0, 2}}, {Q8_0, 32, 34, {0}},
                          {Q4_K, 256, 144, {0, 2}}, {Q5_K, 256, 176, {0, 2}}, {Q6_K, 256, 210, {208}}};
  int n = 37, k = 512, bad = 0;
  for (auto& t : types) {
    size_t rb = size_t(k / t.unit) * t.bytes;
    std::vector<uint8_t> raw(rb * n);
    for (auto& b : raw) b = rng() & 0xff;
    std::normal_distribution<float> nd(0.f, 0.01f);
    for (int r = 0; r < n; ++r) for (int u = 0; u < k / t.unit; ++u) for (int off : t.halfs) {
      uint16_t h = f2h(nd(rng)); std::memcpy(&raw[r * rb + u * t.bytes + off], &h, 2); }
    Layout l = layout_of(t.type, 0);
    std::vector<uint8_t> packed(packed_bytes(l, n, k));
    repack_gguf(t.type, raw.data(), n, k, packed.data());
    for (int m : {1, 3, 8, 11}) {
      std::vector<int8_t> q(m * k); std::vector<float> d(m * k / 32); std::vector<int32_t> s(m * k / 32 * 2); std::vector<float> ds(m * k / 32 * 3);
      for (int i = 0; i < m * k / 32; ++i) {
        d[i] = 0.01f * (1 + i % 7); int lo = 0, hi = 0;
        for (int j = 0; j < 32; ++j) { int v = int(rng() % 255) - 127; q[i * 32 + j] = int8_t(v); (j < 16 ? lo : hi) += v; }
        s[2 * i] = lo; s[2 * i + 1] = hi;
        ds[3 * i] = d[i] * float(lo); ds[3 * i + 1] = d[i] * float(hi); ds[3 * i + 2] = d[i] * float(lo + hi);
      }
      XQuant x{q.data(), d.data(), s.data(), ds.data(), k};
      std::vector<float> a(m * n), b(m * n);
      scalar::matmul(l, packed.data(), n, k, x, m, a.data(), 0, n_tiles(n));
      neon::matmul(l, packed.data(), n, k, x, m, b.data(), 0, n_tiles(n));
      bool same = std::memcmp(a.data(), b.data(), sizeof(float) * m * n) == 0;
      if (!same) { bad++; printf("type %d m %d: differs (a %g b %g)\n", t.type, m, a[0], b[0]); }
    }
  }
  // float32 tiles (fkernel.h): a matrix whose last tile is partial, 1..13 rows
  {
    int fn = 45, fk = 96;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> w(size_t(fn) * fk), packed(size_t(fn + 15) / 16 * 16 * fk);
    for (auto& v : w) v = nd(rng);
    repack_float(w.data(), fn, fk, packed.data());
    for (int m = 1; m <= 13; ++m) {
      std::vector<float> x(size_t(m) * fk), a(size_t(m) * fn), b(size_t(m) * fn);
      for (auto& v : x) v = nd(rng);
      int tiles = (fn + 15) / 16;
      scalar::fmatmul(packed.data(), fn, fk, x.data(), m, a.data(), 0, tiles);
      neon::fmatmul(packed.data(), fn, fk, x.data(), m, b.data(), 0, tiles);
      if (std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) != 0) { bad++; printf("float m %d: differs\n", m); }
    }
  }
  printf("%s\n", bad ? "FAIL" : "neon == scalar bitwise for every type and width, float32 tiles included");
  return bad != 0;
}
