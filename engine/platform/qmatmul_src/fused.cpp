#include "fused.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLXCEL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MLXCEL_CLONES
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

// v[j] = exp(v[j] - shift)
MLXCEL_CLONES void exp_shifted(float* v, int n, float shift) {
  for (int j = 0; j < n; ++j) v[j] = exp_poly(v[j] - shift);
}

MLXCEL_CLONES void axpy(float* y, const float* x, float a, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

struct View4 {  // a strided [b, h, l, d] float array
  const float* p;
  int64_t s0, s1, s2, s3;
  const float* row(int b, int h, int l) const { return p + b * s0 + h * s1 + l * s2; }
};

View4 view4(const mx::array& a) {
  auto st = a.strides();
  return {a.data<float>(), st[0], st[1], st[2], st[3]};
}

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
        float ms = dot(xr, xr, d) / float(d);
        float inv = 1.f / std::sqrt(ms + eps);
        float* o = op + size_t(r) * d;
        for (int i = 0; i < d; ++i) o[i] = (xr[i] * inv) * wp[i];
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

// One query's attention over keys 0 .. n-1 of one key/value head, into o[D]: the scaled query qs
// (already multiplied by the scale), scores and the weighted sum in the caller's scratch sc[n] and
// acc[D]. Both attention primitives call this, so a query's bits are the same in either.
static void attend(const float* qs, const View4& kv, const View4& vv, int b, int hk, int n, int D, float* sc,
                   float* acc, float* o) {
  float mx_ = -INFINITY;
  for (int j = 0; j < n; ++j) {
    sc[j] = dot(qs, kv.row(b, hk, j), D);
    mx_ = std::max(mx_, sc[j]);
  }
  exp_shifted(sc, n, mx_);
  float sum = 0.f;
  for (int j = 0; j < n; ++j) sum += sc[j];
  std::fill(acc, acc + D, 0.f);
  for (int j = 0; j < n; ++j) axpy(acc, vv.row(b, hk, j), sc[j], D);
  const float inv = 1.f / sum;
  for (int i = 0; i < D; ++i) o[i] = acc[i] * inv;
}

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
      std::vector<float> qs(D), sc(S), acc(D);
      const int group = Hq / Hk;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < Hq; ++h)
          for (int l = 0; l < L; ++l) {
            const float* qr = qv.row(b, h, l);
            for (int i = 0; i < D; ++i) qs[i] = qr[i * qv.s3] * scale;
            const int n = causal ? std::min(S, S - L + l + 1) : S;
            attend(qs.data(), kv, vv, b, h / group, n, D, sc.data(), acc.data(),
                   op + ((size_t(b) * Hq + h) * L + l) * D);
          }
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


// Rows of different lengths, queries flat (fused.h). Each query is computed by AttentionP's `attend`.
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
      std::vector<float> qs(D), sc(S), acc(D);
      const int group = Hq / Hk;
      for (int i = 0; i < N; ++i) {
        // the caller checks rows and positions; here they are only kept inside the arrays
        const int b = std::min(std::max(rows[i], 0), B - 1);
        const int n = std::min(std::max(pos[i] + 1, 1), S);
        for (int h = 0; h < Hq; ++h) {
          const float* qr = qp + i * qs0 + h * qs1;
          for (int j = 0; j < D; ++j) qs[j] = qr[j * qs2] * scale;
          attend(qs.data(), kv, vv, b, h / group, n, D, sc.data(), acc.data(), op + (size_t(i) * Hq + h) * D);
        }
      }
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
      const int half = dims / 2;
      std::vector<float> cs(size_t(half) * 2);
      for (int n = 0; n < N; ++n) {
        for (int i = 0; i < half; ++i) {
          float inv = std::pow(base, -float(2 * i) / float(dims));
          float theta = float(pos[n]) * scale * inv;
          cs[size_t(i) * 2] = std::cos(theta);
          cs[size_t(i) * 2 + 1] = std::sin(theta);
        }
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


// silu(g) * x with the exp above.
MLXCEL_CLONES void silu_times(const float* g, const float* x, float* o, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = (g[i] * (1.0f / (1.0f + exp_poly(-g[i])))) * x[i];
}

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

mx::Stream cpu() { return mx::default_stream(mx::Device::cpu); }

mx::array f32(const mx::array& a) { return a.dtype() == mx::float32 ? a : mx::astype(a, mx::float32, cpu()); }

}  // namespace

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
