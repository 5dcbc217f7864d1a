#include "fused.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "ops.h"
#include "rows.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLXCEL_CLONES __attribute__((target_clones("avx2", "default")))
// element-wise loops that gain from 16 lanes: the same operations in each clone (no contraction)
#define MLXCEL_WIDE_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MLXCEL_CLONES
#define MLXCEL_WIDE_CLONES
#endif

namespace mlxcel_q {
namespace {

// 16 independent partial sums, added pairwise (8 + 8, 4 + 4, ...): vectorizable, in a fixed order.
MLXCEL_CLONES float dot(const float* a, const float* b, int n) {
  float acc[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  float s = acc[0];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// exp(x): Cody-Waite range reduction and a degree-6 polynomial (relative error ~2 ulp; x clamped
// to [-87, 88]), without branches so each clone vectorizes a loop of it; -ffp-contract=off keeps
// the same roundings in every clone.
static inline float exp_poly(float x) {
  float t = std::min(88.0f, std::max(-87.0f, x));
  float k = std::floor(t * 1.44269504088896341f + 0.5f);
  float r = t - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  return p * std::bit_cast<float>((int32_t(k) + 127) << 23);
}

View4 view4(const mx::array& a) {
  auto st = a.strides();
  return {a.data<float>(), st[0], st[1], st[2], st[3]};
}

}  // namespace

// ----------------------------------------------------------------------------- row code (rows.h)

// The row code below splits its rows (element-wise ops: their elements) among the kernel threads
// when a call has enough of them (a prompt chunk, a verify block; split_units keeps a one-token
// call on the caller). Each row or element is computed by the same code whichever thread takes it,
// so the bits do not depend on the split. Before, they ran on the evaluating thread alone while the
// other kernel thread spun: SmolLM2's 122-token prefill spent about a quarter of its wall time so.
// The cost estimates only decide how finely a call is cut.
constexpr size_t NORM_COST = 8, SILU_COST = 32, ROPE_COST = 16;
constexpr size_t SILU_SPAN = 4096;  // elements per unit of a threaded silu_times

void rms_norm_rows(const float* x, const float* w, float* o, int d, int rows, float eps) {
  auto norm = [=](int r0, int r1) {
    for (int r = r0; r < r1; ++r) {
      const float* xr = x + size_t(r) * d;
      float ms = dot(xr, xr, d) / float(d);
      float inv = 1.f / std::sqrt(ms + eps);
      float* orow = o + size_t(r) * d;
      for (int i = 0; i < d; ++i) orow[i] = (xr[i] * inv) * w[i];
    }
  };
  split_units(rows, size_t(rows) * d * NORM_COST, norm);
}

namespace {

// silu(g) * x with the exp above, over [0, n).
MLXCEL_WIDE_CLONES void silu_span(const float* g, const float* x, float* o, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = (g[i] * (1.0f / (1.0f + exp_poly(-g[i])))) * x[i];
}

// cos and sin of every rotated pair at each of `n` positions ([n][half][2]), kept for the next call
// at the same positions: a forward's layers all rotate at the step's positions, so they are computed
// once a step (same values, same bits) instead of twice a layer (q and k).
struct RopeTable {
  std::vector<int32_t> pos;
  int dims = 0;
  float base = 0.f, scale = 0.f;
  std::vector<float> cs;
};

const float* rope_table(const int32_t* pos, int N, int dims, float base, float scale) {
  static thread_local RopeTable t;
  const int half = dims / 2;
  if (t.dims == dims && t.base == base && t.scale == scale && t.pos.size() == size_t(N) &&
      std::equal(pos, pos + N, t.pos.begin()))
    return t.cs.data();
  t.pos.assign(pos, pos + N);
  t.dims = dims, t.base = base, t.scale = scale;
  t.cs.resize(size_t(N) * half * 2);
  float* cs = t.cs.data();
  split_units(N, size_t(N) * half * ROPE_COST * 4, [=](int n0, int n1) {
    for (int n = n0; n < n1; ++n)
      for (int i = 0; i < half; ++i) {
        float inv = std::pow(base, -float(2 * i) / float(dims));
        float theta = float(pos[n]) * scale * inv;
        cs[(size_t(n) * half + i) * 2] = std::cos(theta);
        cs[(size_t(n) * half + i) * 2 + 1] = std::sin(theta);
      }
  });
  return cs;
}

}  // namespace

void silu_times(const float* g, const float* x, float* o, size_t n) {
  const size_t units = (n + SILU_SPAN - 1) / SILU_SPAN;
  split_units(int(units), n * SILU_COST, [=](int u0, int u1) {
    const size_t a = size_t(u0) * SILU_SPAN, b = std::min(n, size_t(u1) * SILU_SPAN);
    silu_span(g + a, x + a, o + a, b - a);
  });
}

void rope_positions_rows(const float* xp, int64_t s0, int64_t s1, int64_t s2, const int32_t* pos, float* op, int N,
                         int H, int D, int dims, bool trad, float base, float scale) {
  const int half = dims / 2;
  const float* table = rope_table(pos, N, dims, base, scale);
  auto rotate = [=](int n0, int n1) {
    for (int n = n0; n < n1; ++n) {
      const float* cs = table + size_t(n) * half * 2;
      for (int h = 0; h < H; ++h) {
        const float* xr = xp + n * s0 + h * s1;
        float* o = op + (size_t(n) * H + h) * D;
        for (int i = 0; i < half; ++i) {
          int i1 = trad ? 2 * i : i, i2 = trad ? 2 * i + 1 : i + half;
          float x1 = xr[i1 * s2], x2 = xr[i2 * s2];
          o[i1] = x1 * cs[2 * i] - x2 * cs[2 * i + 1];
          o[i2] = x1 * cs[2 * i + 1] + x2 * cs[2 * i];
        }
        for (int i = dims; i < D; ++i) o[i] = xr[i * s2];
      }
    }
  };
  split_units(N, size_t(N) * H * D * ROPE_COST, rotate);
}

namespace {

class RMSNormP : public mx::UnaryPrimitive {
 public:
  RMSNormP(mx::Stream s, float eps) : mx::UnaryPrimitive(s), eps_(eps) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    const auto& x = in[0];
    const auto& w = in[1];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(x);
    enc.set_input_array(w);
    enc.set_output_array(out);
    const int d = x.shape(-1);
    const int rows = int(x.size() / d);
    const bool strided = !x.flags().row_contiguous;
    enc.dispatch([xp = x.data<float>(), wp = w.data<float>(), op = out.data<float>(), d, rows, eps = eps_, strided,
                  shape = x.shape(), strides = x.strides()]() {
      std::vector<float> row(strided ? d : 0);
      for (int r = 0; r < rows; ++r) {
        const float* xr = xp + size_t(r) * d;
        if (strided) {
          for (int i = 0; i < d; ++i) row[i] = xp[mx::elem_to_loc(r * d + i, shape, strides)];
          xr = row.data();
        }
        rms_norm_rows(xr, wp, op + size_t(r) * d, d, 1, eps);
      }
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelRMSNorm"; }
  bool is_equivalent(const mx::Primitive& o) const override { return eps_ == static_cast<const RMSNormP&>(o).eps_; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }

 private:
  float eps_;
};

class RopeP : public mx::UnaryPrimitive {
 public:
  RopeP(mx::Stream s, int dims, bool trad, float base, float scale, int offset)
      : mx::UnaryPrimitive(s), dims_(dims), trad_(trad), base_(base), scale_(scale), offset_(offset) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    const auto& x = in[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(x);
    enc.set_output_array(out);
    View4 v = view4(x);
    enc.dispatch([v, op = out.data<float>(), B = x.shape(0), H = x.shape(1), L = x.shape(2), D = x.shape(3),
                  dims = dims_, trad = trad_, base = base_, scale = scale_, offset = offset_]() {
      const int half = dims / 2;
      std::vector<float> cs(size_t(L) * half * 2);
      for (int l = 0; l < L; ++l)
        for (int i = 0; i < half; ++i) {
          float inv = std::pow(base, -float(2 * i) / float(dims));
          float theta = float(offset + l) * scale * inv;
          cs[(size_t(l) * half + i) * 2] = std::cos(theta);
          cs[(size_t(l) * half + i) * 2 + 1] = std::sin(theta);
        }
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int l = 0; l < L; ++l) {
            const float* xr = v.row(b, h, l);
            float* o = op + ((size_t(b) * H + h) * L + l) * D;
            const float* c = cs.data() + size_t(l) * half * 2;
            for (int i = 0; i < half; ++i) {
              int i1 = trad ? 2 * i : i, i2 = trad ? 2 * i + 1 : i + half;
              float x1 = xr[i1 * v.s3], x2 = xr[i2 * v.s3];
              o[i1] = x1 * c[2 * i] - x2 * c[2 * i + 1];
              o[i2] = x1 * c[2 * i + 1] + x2 * c[2 * i];
            }
            for (int i = dims; i < D; ++i) o[i] = xr[i * v.s3];
          }
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelRope"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    const auto& r = static_cast<const RopeP&>(o);
    return dims_ == r.dims_ && trad_ == r.trad_ && base_ == r.base_ && scale_ == r.scale_ && offset_ == r.offset_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }

 private:
  int dims_;
  bool trad_;
  float base_, scale_;
  int offset_;
};

// ----------------------------------------------------------------------------- attention
// One query's scores, softmax and weighted sum, written with 8-float vectors (GCC's vector
// extension) and fused multiply-adds (fma8, one rounding each; see the two compilations below), so
// the bits do not depend on the ISA; -ffp-contract=off keeps every other multiply and add apart.
// What a query's result is, defined once here and independent of the call's shape:
//   score_j = ((p0+p4)+(p2+p6)) + ((p1+p5)+(p3+p7)),  p_t = fma(q[8c+t], k_j[8c+t], p_t) over c in order
//   m = max_j score_j;  e_j = exp_poly(score_j - m);  sum = the same tree over 8 lanes, lane t
//   adding e_j for j = t mod 8 in order;  o[d] = acc_d * (1/sum), acc_d = fma(e_j, v_j[d], acc_d) over j in order.
// Eight keys are scored at once (eight independent accumulators, one tree reduction shared by
// them through shuffles); a short last group repeats the last key, whose extra scores are unused.
typedef float vf8 __attribute__((vector_size(32)));
typedef int vi8 __attribute__((vector_size(32)));
#define MLXCEL_INLINE inline __attribute__((always_inline))

static MLXCEL_INLINE vf8 load8(const float* p) {
  vf8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
static MLXCEL_INLINE void store8(float* p, vf8 v) { std::memcpy(p, &v, sizeof v); }

// Lane k of the result: the tree above over the lanes of a_k.
static MLXCEL_INLINE vf8 reduce8(vf8 a0, vf8 a1, vf8 a2, vf8 a3, vf8 a4, vf8 a5, vf8 a6, vf8 a7) {
  const vi8 lo1 = {0, 1, 2, 3, 8, 9, 10, 11}, hi1 = {4, 5, 6, 7, 12, 13, 14, 15};
  vf8 b0 = __builtin_shuffle(a0, a1, lo1) + __builtin_shuffle(a0, a1, hi1);  // t+4 folded: [a0 q0..q3, a1 q0..q3]
  vf8 b1 = __builtin_shuffle(a2, a3, lo1) + __builtin_shuffle(a2, a3, hi1);
  vf8 b2 = __builtin_shuffle(a4, a5, lo1) + __builtin_shuffle(a4, a5, hi1);
  vf8 b3 = __builtin_shuffle(a6, a7, lo1) + __builtin_shuffle(a6, a7, hi1);
  const vi8 lo2 = {0, 1, 4, 5, 8, 9, 12, 13}, hi2 = {2, 3, 6, 7, 10, 11, 14, 15};
  vf8 c0 = __builtin_shuffle(b0, b1, lo2) + __builtin_shuffle(b0, b1, hi2);  // t+2 folded: [a0 r0 r1, a1 .., a2 .., a3 ..]
  vf8 c1 = __builtin_shuffle(b2, b3, lo2) + __builtin_shuffle(b2, b3, hi2);
  const vi8 lo3 = {0, 2, 4, 6, 8, 10, 12, 14}, hi3 = {1, 3, 5, 7, 9, 11, 13, 15};
  return __builtin_shuffle(c0, c1, lo3) + __builtin_shuffle(c0, c1, hi3);  // r0 + r1, in key order
}

static MLXCEL_INLINE float tree8(vf8 v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

// One query of a group sharing one head's keys and values (attend_many).
struct QueryRef {
  const float* qs;  // the query times the scale, D floats
  int n;            // it sees keys 0 .. n-1, n >= 1
  float* o;         // its D outputs
};

// Keys per block of attend_many's weighted sums: a block's value rows stay in L1 while every query
// of the group adds them (32 rows of 64 floats: 8 KiB).
constexpr int kValueBlock = 32;

// The two compilations of the arithmetic: FMA instructions where the CPU has them (x86: AVX2 and
// FMA; dispatched at run time), std::fma lane by lane elsewhere. A fused multiply-add is rounded
// once whatever computes it, so both give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLXCEL_ATTEND_X86 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace attend_x86 {
static MLXCEL_INLINE vf8 fma8(vf8 a, vf8 b, vf8 c) { return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#include "attend_body.h"
}  // namespace attend_x86
#pragma GCC pop_options
#endif
namespace attend_portable {
static MLXCEL_INLINE vf8 fma8(vf8 a, vf8 b, vf8 c) {
  vf8 r;
  for (int t = 0; t < 8; ++t) r[t] = std::fma(a[t], b[t], c[t]);
  return r;
}
#include "attend_body.h"
}  // namespace attend_portable

#ifdef MLXCEL_ATTEND_X86
// AVX-512: two queries of a group in one 16-float register, query a's 8 lanes below query b's,
// each lane doing what attend_body.h's 8-wide code does for its query (the keys and values
// broadcast to both halves), so twice the work per instruction and the same bits.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx2,fma")
namespace attend_x512 {
static MLXCEL_INLINE vf8 fma8(vf8 a, vf8 b, vf8 c) { return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static MLXCEL_INLINE __m512 pair_of(const float* a, const float* b) {  // [a[0 .. 8), b[0 .. 8)]
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}
static MLXCEL_INLINE __m512 both(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
static MLXCEL_INLINE vf8 lo(__m512 v) { return (vf8)_mm512_castps512_ps256(v); }
static MLXCEL_INLINE vf8 hi(__m512 v) { return (vf8)_mm512_extractf32x8_ps(v, 1); }

// score8 for queries qa and qb at once, into sa and sb.
static MLXCEL_INLINE void score_pair(const float* qa, const float* qb, const float* const* kr, int D, float* sa,
                                     float* sb) {
  __m512 a[8];
  for (int t = 0; t < 8; ++t) a[t] = _mm512_setzero_ps();
  for (int c = 0; c < D; c += 8) {
    const __m512 qv = pair_of(qa + c, qb + c);
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) a[t] = _mm512_fmadd_ps(qv, both(kr[t] + c), a[t]);
  }
  store8(sa, reduce8(lo(a[0]), lo(a[1]), lo(a[2]), lo(a[3]), lo(a[4]), lo(a[5]), lo(a[6]), lo(a[7])));
  store8(sb, reduce8(hi(a[0]), hi(a[1]), hi(a[2]), hi(a[3]), hi(a[4]), hi(a[5]), hi(a[6]), hi(a[7])));
}

// weighted_block for queries a and b at once over the same keys j0 .. j1-1.
template <int NV>
static MLXCEL_INLINE void weighted_block_pair(const float* ea, const float* eb, int j0, int j1, const View4& vv,
                                              int b, int hk, int d0, float* oa, float* ob) {
  __m512 acc[NV];
  for (int t = 0; t < NV; ++t) acc[t] = j0 == 0 ? _mm512_setzero_ps() : pair_of(oa + d0 + 8 * t, ob + d0 + 8 * t);
  for (int j = j0; j < j1; ++j) {
    const float* vr = vv.row(b, hk, j) + d0;
    const __m512 e = _mm512_insertf32x8(_mm512_set1_ps(0.f + ea[j]), _mm256_set1_ps(0.f + eb[j]), 1);
#pragma GCC unroll 8
    for (int t = 0; t < NV; ++t) acc[t] = _mm512_fmadd_ps(e, both(vr + 8 * t), acc[t]);
  }
  for (int t = 0; t < NV; ++t) {
    store8(oa + d0 + 8 * t, lo(acc[t]));
    store8(ob + d0 + 8 * t, hi(acc[t]));
  }
}

static MLXCEL_INLINE void weighted_range_pair(const float* ea, const float* eb, int j0, int j1, const View4& vv, int b,
                                              int hk, int D, float* oa, float* ob) {
  int d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) weighted_block_pair<8>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob);
  switch ((D - d0) / 8) {
    case 7: weighted_block_pair<7>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob); break;
    case 6: weighted_block_pair<6>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob); break;
    case 5: weighted_block_pair<5>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob); break;
    case 4: weighted_block_pair<4>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob); break;
    case 3: weighted_block_pair<3>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob); break;
    case 2: weighted_block_pair<2>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob); break;
    case 1: weighted_block_pair<1>(ea, eb, j0, j1, vv, b, hk, d0, oa, ob); break;
    default: break;
  }
}
#define MLXCEL_ATTEND_PAIRS 1
#include "attend_body.h"
#undef MLXCEL_ATTEND_PAIRS
}  // namespace attend_x512
#pragma GCC pop_options
#endif

// Which compilation this call's attention runs: 2 = AVX-512 pairs, 1 = AVX2 + FMA, 0 = portable.
// The CPU must have the instructions; set_isa("avx2") or ("scalar") caps it (the tests compare the
// compilations that way).
int attend_level() {
#ifdef MLXCEL_ATTEND_X86
  static const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  static const bool x512 = fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512vl");
  const std::string name = isa();
  if (name == "scalar" || !fma) return 0;
  return name == "avx2" || !x512 ? 1 : 2;
#else
  return 0;
#endif
}

void attend(const float* qs, const View4& kv, const View4& vv, int b, int hk, int n, int D, float* sc, float* kpad,
            float* o, int level) {
#ifdef MLXCEL_ATTEND_X86
  if (level >= 1) return attend_x86::attend(qs, kv, vv, b, hk, n, D, sc, kpad, o);
#endif
  (void)level;
  attend_portable::attend(qs, kv, vv, b, hk, n, D, sc, kpad, o);
}

void attend_many(const QueryRef* q, int nq, const View4& kv, const View4& vv, int b, int hk, int D, float* sc,
                 int ld, float* inv, int level) {
#ifdef MLXCEL_ATTEND_X86
  if (level == 2) return attend_x512::attend_many(q, nq, kv, vv, b, hk, D, sc, ld, inv);
  if (level == 1) return attend_x86::attend_many(q, nq, kv, vv, b, hk, D, sc, ld, inv);
#endif
  (void)level;
  attend_portable::attend_many(q, nq, kv, vv, b, hk, D, sc, ld, inv);
}

// Per-thread scratch of the attention primitives, sized for keys 0 .. s-1 and head size d.
struct AttendScratch {
  std::vector<float> qs, sc, kpad, inv;
  std::vector<QueryRef> refs;
  void fit(int s, int d) {
    const size_t d8 = (size_t(d) + 7) & ~size_t(7);
    if (qs.size() < d8) qs.assign(d8, 0.f);
    if (sc.size() < size_t(s) + 8) sc.resize(size_t(s) + 8);
    if (kpad.size() < 8 * d8) kpad.resize(8 * d8);
  }
  // room for a group of nq queries (attend_many); returns the score rows' stride
  int fit_group(int nq, int s, int d) {
    const int ld = ((s + 7) & ~7) + 8;
    if (qs.size() < size_t(nq) * d) qs.resize(size_t(nq) * d);
    if (sc.size() < size_t(nq) * ld) sc.resize(size_t(nq) * ld);
    if (inv.size() < size_t(nq)) inv.resize(nq);
    refs.clear();
    return ld;
  }
  // the query row (stride s3) times the scale into qs (zero-padded to 8)
  const float* query(const float* qr, int64_t s3, int d, float scale) {
    scaled(qs.data(), qr, s3, d, scale);
    for (int i = d; i < ((d + 7) & ~7); ++i) qs[i] = 0.f;
    return qs.data();
  }
  // the group's next query: its row times the scale into its own slot of qs
  void add(const float* qr, int64_t s3, int d, float scale, int n, float* o) {
    float* dst = qs.data() + refs.size() * size_t(d);
    scaled(dst, qr, s3, d, scale);
    refs.push_back({dst, n, o});
  }
  static void scaled(float* dst, const float* qr, int64_t s3, int d, float scale) {
    for (int i = 0; i < d; ++i) dst[i] = qr[i * s3] * scale;
  }
};

AttendScratch& attend_scratch() {
  static thread_local AttendScratch s;
  return s;
}

// Queries per unit of a threaded attention call (a unit: one head's run of consecutive queries).
constexpr int kQueryChunk = 8;
// Queries per unit of the grouped path (a unit: a run of queries of every query head that reads
// one key head), about this many whatever the heads per key head.
constexpr int kGroupQueries = 24;
// A grouped call with fewer units than this splits its key heads' query heads into units of one
// head, so that the kernel threads still get several units each (same bits either way).
constexpr int kMinGroupUnits = 4;

// Whether attend_many can compute these keys and values (unit-stride rows, D a multiple of 8).
bool groupable(const View4& kv, const View4& vv, int D) { return kv.s3 == 1 && vv.s3 == 1 && D % 8 == 0; }

class AttentionP : public mx::UnaryPrimitive {
 public:
  AttentionP(mx::Stream s, float scale, bool causal) : mx::UnaryPrimitive(s), scale_(scale), causal_(causal) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    enc.set_output_array(out);
    const auto& q = in[0];
    const auto& k = in[1];
    enc.dispatch([qv = view4(q), kv = view4(k), vv = view4(in[2]), op = out.data<float>(), B = q.shape(0),
                  Hq = q.shape(1), L = q.shape(2), D = q.shape(3), Hk = k.shape(1), S = k.shape(2), scale = scale_,
                  causal = causal_]() {
      const int group = Hq / Hk;
      const int level = attend_level();
      // keys seen in all, for sizing the split: causal rows see S - L + 1 .. S keys
      const size_t keys = causal ? size_t(L) * std::max(0, S - L) + size_t(L) * (L + 1) / 2 : size_t(L) * S;
      const size_t macs = size_t(B) * Hq * keys * D * 2;
      auto keys_of = [&](int l) { return causal ? std::min(S, S - L + l + 1) : S; };
      if (groupable(kv, vv, D)) {
        // Units (b, key head, heads of it, run of queries), the run fastest; which unit or thread
        // computes a query does not change its bits (attend_many's arithmetic per query is attend's).
        const int chunk = std::max(1, kGroupQueries / group);
        const int chunks = (L + chunk - 1) / chunk;
        const int hg = B * Hk * chunks >= kMinGroupUnits ? group : 1;  // query heads per unit
        const int subs = group / hg;
        parallel_for(B * Hk * subs * chunks, macs, [&](int u0, int u1) {
          AttendScratch& scr = attend_scratch();
          for (int u = u0; u < u1; ++u) {
            const int c = u % chunks, sub = (u / chunks) % subs, hk = (u / chunks / subs) % Hk;
            const int b = u / chunks / subs / Hk;
            const int l0 = c * chunk, l1 = std::min(L, l0 + chunk);
            const int ld = scr.fit_group(hg * (l1 - l0), S, D);
            for (int h = hk * group + sub * hg; h < hk * group + (sub + 1) * hg; ++h)
              for (int l = l0; l < l1; ++l) {
                float* o = op + ((size_t(b) * Hq + h) * L + l) * D;
                const int n = keys_of(l);
                if (n <= 0)  // a query that sees no key (more queries than keys, causal)
                  std::fill(o, o + D, NAN);
                else
                  scr.add(qv.row(b, h, l), qv.s3, D, scale, n, o);
              }
            if (!scr.refs.empty())
              attend_many(scr.refs.data(), int(scr.refs.size()), kv, vv, b, hk, D, scr.sc.data(), ld,
                          scr.inv.data(), level);
          }
        });
        return;
      }
      const int chunks = (L + kQueryChunk - 1) / kQueryChunk;
      // Units (b, h, chunk of queries), chunk fastest; which thread computes a query does not
      // change its bits (attend's arithmetic depends on neither the thread nor the other queries).
      parallel_for(B * Hq * chunks, macs, [&](int u0, int u1) {
        AttendScratch& scr = attend_scratch();
        scr.fit(S, D);
        for (int u = u0; u < u1; ++u) {
          const int c = u % chunks, h = (u / chunks) % Hq, b = u / chunks / Hq;
          for (int l = c * kQueryChunk; l < std::min(L, (c + 1) * kQueryChunk); ++l) {
            const int n = keys_of(l);
            float* o = op + ((size_t(b) * Hq + h) * L + l) * D;
            if (n <= 0) {  // a query that sees no key (more queries than keys, causal)
              std::fill(o, o + D, NAN);
              continue;
            }
            attend(scr.query(qv.row(b, h, l), qv.s3, D, scale), kv, vv, b, h / group, n, D, scr.sc.data(),
                   scr.kpad.data(), o, level);
          }
        }
      });
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelAttention"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    const auto& r = static_cast<const AttentionP&>(o);
    return scale_ == r.scale_ && causal_ == r.causal_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }

 private:
  float scale_;
  bool causal_;
};

// Rows of different lengths, queries flat (fused.h). Each query is computed by AttentionP's `attend`
// (or attend_many, the same bits).
class RaggedAttentionP : public mx::UnaryPrimitive {
 public:
  RaggedAttentionP(mx::Stream s, float scale) : mx::UnaryPrimitive(s), scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    enc.set_output_array(out);
    const auto& q = in[0];
    const auto& k = in[1];
    auto qs3 = q.strides();
    enc.dispatch([qp = q.data<float>(), qs0 = qs3[0], qs1 = qs3[1], qs2 = qs3[2], kv = view4(k), vv = view4(in[2]),
                  rows = in[3].data<int32_t>(), pos = in[4].data<int32_t>(), op = out.data<float>(), N = q.shape(0),
                  Hq = q.shape(1), D = q.shape(2), B = k.shape(0), Hk = k.shape(1), S = k.shape(2),
                  scale = scale_]() {
      ragged_attention_rows(qp, qs0, qs1, qs2, kv, vv, rows, pos, op, N, Hq, D, B, Hk, S, scale);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelRaggedAttention"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    return scale_ == static_cast<const RaggedAttentionP&>(o).scale_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }

 private:
  float scale_;
};

// x[n, h, d], token i at positions[i]; the per-token arithmetic is RopeP's.
class RopePositionsP : public mx::UnaryPrimitive {
 public:
  RopePositionsP(mx::Stream s, int dims, bool trad, float base, float scale)
      : mx::UnaryPrimitive(s), dims_(dims), trad_(trad), base_(base), scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    const auto& x = in[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(x);
    enc.set_input_array(in[1]);
    enc.set_output_array(out);
    auto st = x.strides();
    enc.dispatch([xp = x.data<float>(), s0 = st[0], s1 = st[1], s2 = st[2], pos = in[1].data<int32_t>(),
                  op = out.data<float>(), N = x.shape(0), H = x.shape(1), D = x.shape(2), dims = dims_, trad = trad_,
                  base = base_, scale = scale_]() {
      rope_positions_rows(xp, s0, s1, s2, pos, op, N, H, D, dims, trad, base, scale);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelRopePositions"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    const auto& r = static_cast<const RopePositionsP&>(o);
    return dims_ == r.dims_ && trad_ == r.trad_ && base_ == r.base_ && scale_ == r.scale_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }

 private:
  int dims_;
  bool trad_;
  float base_, scale_;
};



class SwiGLUP : public mx::UnaryPrimitive {
 public:
  explicit SwiGLUP(mx::Stream s) : mx::UnaryPrimitive(s) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(in[0]);
    enc.set_input_array(in[1]);
    enc.set_output_array(out);
    // a strided input is gathered (the MLP's inputs, the kernel's outputs, are contiguous)
    struct In { const float* p; bool strided; mx::Shape shape; mx::Strides strides; };
    auto in_of = [](const mx::array& a) { return In{a.data<float>(), !a.flags().row_contiguous, a.shape(), a.strides()}; };
    enc.dispatch([g = in_of(in[0]), x = in_of(in[1]), op = out.data<float>(), n = out.size()]() {
      std::vector<float> gs, xs;
      auto rows = [n](const In& a, std::vector<float>& buf) {
        if (!a.strided) return a.p;
        buf.resize(n);
        for (size_t i = 0; i < n; ++i) buf[i] = a.p[mx::elem_to_loc(int64_t(i), a.shape, a.strides)];
        return (const float*)buf.data();
      };
      const float* gp = rows(g, gs);
      const float* xp = rows(x, xs);
      silu_times(gp, xp, op, n);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelSwiGLU"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }
};

}  // namespace

void ragged_attention_rows(const float* qp, int64_t qs0, int64_t qs1, int64_t qs2, const View4& kv, const View4& vv,
                           const int32_t* rows, const int32_t* pos, float* op, int N, int Hq, int D, int B, int Hk,
                           int S, float scale) {
  const int group = Hq / Hk;
  const int level = attend_level();
  size_t keys = 0;
  for (int i = 0; i < N; ++i) keys += size_t(std::min(std::max(pos[i] + 1, 1), S));
  // the caller checks rows and positions; here they are only kept inside the arrays
  auto row_of = [&](int i) { return std::min(std::max(rows[i], 0), B - 1); };
  auto keys_of = [&](int i) { return std::min(std::max(pos[i] + 1, 1), S); };
  if (groupable(kv, vv, D)) {
    // Runs of consecutive queries of one row (a verify block, a prompt chunk, a decode row),
    // at most kGroupQueries / group long; units (run, key head, heads of it), heads fastest.
    const int chunk = std::max(1, kGroupQueries / group);
    std::vector<int> starts;
    for (int i = 0; i < N; ++i)
      if (starts.empty() || row_of(i) != row_of(i - 1) || i - starts.back() >= chunk) starts.push_back(i);
    const int runs = int(starts.size());
    starts.push_back(N);
    const int hg = runs * Hk >= kMinGroupUnits ? group : 1;
    const int subs = group / hg;
    parallel_for(runs * Hk * subs, keys * Hq * D * 2, [&](int u0, int u1) {
      AttendScratch& scr = attend_scratch();
      for (int u = u0; u < u1; ++u) {
        const int sub = u % subs, hk = (u / subs) % Hk, r = u / subs / Hk;
        const int i0 = starts[r], i1 = starts[r + 1];
        const int ld = scr.fit_group(hg * (i1 - i0), S, D);
        for (int h = hk * group + sub * hg; h < hk * group + (sub + 1) * hg; ++h)
          for (int i = i0; i < i1; ++i)
            scr.add(qp + i * qs0 + h * qs1, qs2, D, scale, keys_of(i), op + (size_t(i) * Hq + h) * D);
        attend_many(scr.refs.data(), int(scr.refs.size()), kv, vv, row_of(i0), hk, D, scr.sc.data(), ld,
                    scr.inv.data(), level);
      }
    });
    return;
  }
  // units (query, head), head fastest
  parallel_for(N * Hq, keys * Hq * D * 2, [&](int u0, int u1) {
    AttendScratch& scr = attend_scratch();
    scr.fit(S, D);
    for (int u = u0; u < u1; ++u) {
      const int i = u / Hq, h = u % Hq;
      attend(scr.query(qp + i * qs0 + h * qs1, qs2, D, scale), kv, vv, row_of(i), h / group, keys_of(i), D,
             scr.sc.data(), scr.kpad.data(), op + (size_t(i) * Hq + h) * D, level);
    }
  });
}

namespace {


}  // namespace

mx::Stream cpu() { return mx::default_stream(mx::Device::cpu); }

mx::array f32(const mx::array& a) { return a.dtype() == mx::float32 ? a : mx::astype(a, mx::float32, cpu()); }

mx::array swiglu(const mx::array& gate, const mx::array& x) {
  if (gate.shape() != x.shape()) throw std::invalid_argument("swiglu: gate and x must have one shape");
  auto out = mx::array(gate.shape(), mx::float32, std::make_shared<SwiGLUP>(cpu()), {f32(gate), f32(x)});
  return gate.dtype() == mx::float32 ? out : mx::astype(out, gate.dtype(), cpu());
}

mx::array rms_norm(const mx::array& x, const mx::array& w, float eps) {
  if (w.ndim() != 1 || x.shape(-1) != w.shape(0)) throw std::invalid_argument("rms_norm: weight must be [d]");
  auto out = mx::array(x.shape(), mx::float32, std::make_shared<RMSNormP>(cpu(), eps), {f32(x), f32(w)});
  return x.dtype() == mx::float32 ? out : mx::astype(out, x.dtype(), cpu());
}

mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale, int offset) {
  if (x.ndim() != 4 || dims > x.shape(3) || dims % 2) throw std::invalid_argument("rope: x must be [b, h, l, d]");
  auto out = mx::array(x.shape(), mx::float32,
                       std::make_shared<RopeP>(cpu(), dims, traditional, base, scale, offset), {f32(x)});
  return x.dtype() == mx::float32 ? out : mx::astype(out, x.dtype(), cpu());
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || k.shape() != v.shape() || q.shape(3) != k.shape(3) ||
      q.shape(0) != k.shape(0) || q.shape(1) % k.shape(1))
    throw std::invalid_argument("attention: q [b, hq, l, d], k/v [b, hkv, s, d]");
  auto out = mx::array(q.shape(), mx::float32, std::make_shared<AttentionP>(cpu(), scale, causal),
                       {f32(q), f32(k), f32(v)});
  return q.dtype() == mx::float32 ? out : mx::astype(out, q.dtype(), cpu());
}

mx::array ragged_attention(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& rows,
                           const mx::array& positions, float scale) {
  if (q.ndim() != 3 || k.ndim() != 4 || v.ndim() != 4 || k.shape() != v.shape() || q.shape(2) != k.shape(3) ||
      q.shape(1) % k.shape(1) || rows.ndim() != 1 || positions.ndim() != 1 || rows.shape(0) != q.shape(0) ||
      positions.shape(0) != q.shape(0))
    throw std::invalid_argument("ragged_attention: q [n, hq, d], k/v [b, hkv, s, d], rows/positions [n]");
  auto i32 = [](const mx::array& a) { return mx::contiguous(mx::astype(a, mx::int32, cpu()), false, cpu()); };
  auto out = mx::array(q.shape(), mx::float32, std::make_shared<RaggedAttentionP>(cpu(), scale),
                       {f32(q), f32(k), f32(v), i32(rows), i32(positions)});
  return q.dtype() == mx::float32 ? out : mx::astype(out, q.dtype(), cpu());
}

mx::array rope_positions(const mx::array& x, const mx::array& positions, int dims, bool traditional, float base,
                         float scale) {
  if (x.ndim() != 3 || dims > x.shape(2) || dims % 2 || positions.ndim() != 1 || positions.shape(0) != x.shape(0))
    throw std::invalid_argument("rope_positions: x must be [n, h, d], positions [n]");
  auto pos = mx::contiguous(mx::astype(positions, mx::int32, cpu()), false, cpu());
  auto out = mx::array(x.shape(), mx::float32,
                       std::make_shared<RopePositionsP>(cpu(), dims, traditional, base, scale), {f32(x), pos});
  return x.dtype() == mx::float32 ? out : mx::astype(out, x.dtype(), cpu());
}

}  // namespace mlxcel_q
