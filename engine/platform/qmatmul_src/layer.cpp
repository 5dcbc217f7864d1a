#include "layer.h"

#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "fused.h"
#include "ops.h"
#include "rows.h"

namespace mlxcel_q {
namespace {

mx::array i32(const mx::array& a) { return mx::astype(a, mx::int32, cpu()); }

// An input's values in row order: its buffer when row-contiguous, else gathered into `buf` (the
// builders leave inputs as they are: an mx::contiguous would add a primitive per input and call).
template <class T, class Alloc>
const T* rows_of(const mx::array& a, std::vector<T, Alloc>& buf) {
  if (a.flags().row_contiguous) return a.data<T>();
  buf.resize(a.size());
  const T* p = a.data<T>();
  for (size_t i = 0; i < a.size(); ++i) buf[i] = p[mx::elem_to_loc(int64_t(i), a.shape(), a.strides())];
  return buf.data();
}

// y[r, j] += b[j] over rows x cols (MLX's broadcast add of a bias: one float addition per element).
void add_bias(float* y, const float* b, int rows, int cols) {
  split_units(rows, size_t(rows) * cols * 4, [=](int r0, int r1) {
    for (int r = r0; r < r1; ++r)
      for (int j = 0; j < cols; ++j) y[size_t(r) * cols + j] += b[j];
  });
}

// o = a + b over rows x cols (the residual additions).
void add_rows(const float* a, const float* b, float* o, int rows, int cols) {
  split_units(rows, size_t(rows) * cols * 4, [=](int r0, int r1) {
    for (size_t i = size_t(r0) * cols; i < size_t(r1) * cols; ++i) o[i] = a[i] + b[i];
  });
}

// Storage on 64-byte boundaries: the kernels' tile stores into the scratch (ops.h, set_aligned_data).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const Aligned64<U>&) const { return true; }
};
using Floats = std::vector<float, Aligned64<float>>;

// The evaluation's scratch, reused call to call on the stream thread that evaluates.
struct LayerScratch {
  Floats h, x, q, k, a, r, h1, g, u, w, b0, b1, b2;
  std::vector<int32_t> rows, pos;
  static float* fit(Floats& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

LayerScratch& layer_scratch() {
  static thread_local LayerScratch s;
  return s;
}

mx::Shape flat2(int n, int k) { return {n, k}; }

mx::Strides strides2(int k) { return {int64_t(k), 1}; }

struct InParams {
  float eps;
  std::vector<int> types, groups, ns;
  int k, hq, hkv, d;
  bool bias;
  int dims;
  bool trad;
  float base, scale;
  bool operator==(const InParams&) const = default;
};

struct OutParams {
  float attn_scale;
  int o_type, o_group;
  float eps2;
  std::vector<int> gu_types, gu_groups;
  int ffn, down_type, down_group;
  bool o_bias, down_bias;
  bool operator==(const OutParams&) const = default;
};

class LayerInP : public mx::Primitive {
 public:
  LayerInP(mx::Stream s, InParams p) : mx::Primitive(s), p_(std::move(p)) {}

  // inputs: h, norm, positions, W_q, W_k, W_v[, b_q, b_k, b_v]; outputs q, k, v
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
    for (auto& o : out) set_aligned_data(o);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    for (auto& o : out) enc.set_output_array(o);
    const int n = int(in[0].size() / p_.k);
    std::vector<const uint8_t*> wps{in[3].data<uint8_t>(), in[4].data<uint8_t>(), in[5].data<uint8_t>()};
    std::vector<mx::array> bs;
    if (p_.bias)
      for (int i = 6; i < 9; ++i) bs.push_back(mx::array::unsafe_weak_copy(in[i]));
    auto weak = [](const mx::array& a) { return mx::array::unsafe_weak_copy(a); };
    enc.dispatch([h = weak(in[0]), norm = weak(in[1]), posa = weak(in[2]), wps = std::move(wps), bs = std::move(bs),
                  qo = out[0].data<float>(), ko = out[1].data<float>(), vo = out[2].data<float>(), n, p = p_]() {
      LayerScratch& s = layer_scratch();
      const int K = p.k, D = p.d, nq = p.hq * D, nk = p.hkv * D;
      const float* hp = rows_of(h, s.h);
      const float* w = rows_of(norm, s.w);
      const int32_t* pos = rows_of(posa, s.pos);
      float* x = LayerScratch::fit(s.x, size_t(n) * K);
      rms_norm_rows(hp, w, x, K, n, p.eps);
      float* q = LayerScratch::fit(s.q, size_t(n) * nq);
      float* k = LayerScratch::fit(s.k, size_t(n) * nk);
      products_into(x, n, K, false, flat2(n, K), strides2(K), wps, p.types, p.groups, p.ns,
                    {q, k, vo});
      if (!bs.empty()) {
        add_bias(q, rows_of(bs[0], s.b0), n, nq);
        add_bias(k, rows_of(bs[1], s.b1), n, nk);
        add_bias(vo, rows_of(bs[2], s.b2), n, nk);
      }
      rope_positions_rows(q, nq, D, 1, pos, qo, n, p.hq, D, p.dims, p.trad, p.base, p.scale);
      rope_positions_rows(k, nk, D, 1, pos, ko, n, p.hkv, D, p.dims, p.trad, p.base, p.scale);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("CPU only");
  }
  const char* name() const override { return "MlxcelLayerIn"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return p_ == static_cast<const LayerInP&>(other).p_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    const int n = int(in[0].size() / p_.k);
    return {{n, p_.hq, p_.d}, {n, p_.hkv, p_.d}, {n, p_.hkv, p_.d}};
  }

 private:
  InParams p_;
};

class LayerOutP : public mx::UnaryPrimitive {
 public:
  LayerOutP(mx::Stream s, OutParams p) : mx::UnaryPrimitive(s), p_(std::move(p)) {}

  // inputs: h, q, keys, values, rows, positions, W_o, norm2, W_gate, W_up, W_down[, b_o][, b_down]
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    set_aligned_data(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    enc.set_output_array(out);
    const auto& keys = in[2];
    const auto& values = in[3];
    auto ks = keys.strides();
    auto vs = values.strides();
    // head-major views [P, hkv, capacity, d] of the token-major cache, as its head_major() gives
    View4 kv{keys.data<float>(), ks[0], ks[2], ks[1], ks[3]};
    View4 vv{values.data<float>(), vs[0], vs[2], vs[1], vs[3]};
    auto weak = [](const mx::array& a) { return mx::array::unsafe_weak_copy(a); };
    size_t at = 11;
    std::vector<mx::array> ob, db;  // at most one each
    if (p_.o_bias) ob.push_back(weak(in[at++]));
    if (p_.down_bias) db.push_back(weak(in[at++]));
    enc.dispatch([h = weak(in[0]), q = weak(in[1]), kv, vv, rowsa = weak(in[4]), posa = weak(in[5]),
                  wo = in[6].data<uint8_t>(), norm2 = weak(in[7]), wg = in[8].data<uint8_t>(),
                  wu = in[9].data<uint8_t>(), wd = in[10].data<uint8_t>(), ob = std::move(ob), db = std::move(db),
                  op = out.data<float>(), B = keys.shape(0), S = keys.shape(1), Hk = keys.shape(2), p = p_]() {
      LayerScratch& s = layer_scratch();
      const int n = q.shape(0), Hq = q.shape(1), D = q.shape(2), K = int(h.size() / n), F = p.ffn;
      const int nq = Hq * D;
      const float* hp = rows_of(h, s.h);
      const int32_t* rows = rows_of(rowsa, s.rows);
      const int32_t* pos = rows_of(posa, s.pos);
      const float* w2 = rows_of(norm2, s.w);
      const float* qp = rows_of(q, s.q);
      float* a = LayerScratch::fit(s.a, size_t(n) * nq);
      ragged_attention_rows(qp, nq, D, 1, kv, vv, rows, pos, a, n, Hq, D, B, Hk, S, p.attn_scale);
      float* r = LayerScratch::fit(s.r, size_t(n) * K);
      products_into(a, n, nq, false, flat2(n, nq), strides2(nq), {wo}, {p.o_type}, {p.o_group}, {K}, {r});
      if (!ob.empty()) add_bias(r, rows_of(ob[0], s.b0), n, K);
      float* h1 = LayerScratch::fit(s.h1, size_t(n) * K);
      add_rows(hp, r, h1, n, K);
      float* x = LayerScratch::fit(s.x, size_t(n) * K);
      rms_norm_rows(h1, w2, x, K, n, p.eps2);
      float* g = LayerScratch::fit(s.g, size_t(n) * F);
      float* u = LayerScratch::fit(s.u, size_t(n) * F);
      products_into(x, n, K, false, flat2(n, K), strides2(K), {wg, wu}, p.gu_types, p.gu_groups, {F, F},
                    {g, u});
      silu_times(g, u, g, size_t(n) * F);  // element by element: in place is the same arithmetic
      products_into(g, n, F, false, flat2(n, F), strides2(F), {wd}, {p.down_type}, {p.down_group}, {K},
                    {r});
      if (!db.empty()) add_bias(r, rows_of(db[0], s.b1), n, K);
      add_rows(h1, r, op, n, K);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelLayerOut"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return p_ == static_cast<const LayerOutP&>(other).p_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }

 private:
  OutParams p_;
};

void check_vector(const mx::array& a, int n, const char* what) {
  if (a.ndim() != 1 || a.shape(0) != n) throw std::invalid_argument(std::string(what) + " must be [" +
                                                                     std::to_string(n) + "]");
}

}  // namespace

std::vector<mx::array> layer_in(const mx::array& h, const mx::array& norm, float eps,
                                const std::vector<mx::array>& packed, const std::vector<int>& types,
                                const std::vector<int>& groups, const std::vector<int>& ns,
                                const std::vector<mx::array>& biases, const mx::array& positions, int hq, int hkv,
                                int dims, bool traditional, float base, float scale) {
  if (h.ndim() < 2) throw std::invalid_argument("layer_in: h must be [..., n, K]");
  const int K = h.shape(-1);
  const int n = int(h.size() / K);
  if (packed.size() != 3 || types.size() != 3 || groups.size() != 3 || ns.size() != 3)
    throw std::invalid_argument("layer_in: three packed matrices (q, k, v) with their types, groups and ns");
  if (!(biases.empty() || biases.size() == 3)) throw std::invalid_argument("layer_in: no biases or three");
  if (hq <= 0 || hkv <= 0 || hq % hkv || ns[0] % hq) throw std::invalid_argument("layer_in: bad head counts");
  const int d = ns[0] / hq;
  if (ns[1] != hkv * d || ns[2] != hkv * d || dims > d || dims % 2)
    throw std::invalid_argument("layer_in: q/k/v widths do not match the heads");
  for (int i = 0; i < 3; ++i) check_packed(packed[i], types[i], groups[i], ns[i], K);
  check_vector(norm, K, "layer_in: norm");
  check_vector(positions, n, "layer_in: positions");
  std::vector<mx::array> inputs{f32(h), f32(norm), i32(positions)};
  inputs.insert(inputs.end(), packed.begin(), packed.end());
  for (int i = 0; i < int(biases.size()); ++i) {
    check_vector(biases[i], ns[i], "layer_in: bias");
    inputs.push_back(f32(biases[i]));
  }
  auto prim = std::make_shared<LayerInP>(
      cpu(), InParams{eps, types, groups, ns, K, hq, hkv, d, !biases.empty(), dims, traditional, base, scale});
  return mx::array::make_arrays({{n, hq, d}, {n, hkv, d}, {n, hkv, d}}, {mx::float32, mx::float32, mx::float32},
                                prim, inputs);
}

std::vector<mx::array> cache_write(const mx::array& keys, const mx::array& values, const mx::array& rows,
                                   const mx::array& positions, const mx::array& k, const mx::array& v) {
  if (keys.ndim() != 4 || keys.shape() != values.shape() || k.ndim() != 3 || k.shape() != v.shape() ||
      k.shape(1) != keys.shape(2) || k.shape(2) != keys.shape(3))
    throw std::invalid_argument("cache_write: keys/values [P, capacity, hkv, d], k/v [n, hkv, d]");
  const int n = k.shape(0);
  check_vector(rows, n, "cache_write: rows");
  check_vector(positions, n, "cache_write: positions");
  const mx::Shape entries{n, 1, 1, k.shape(1), k.shape(2)};
  const std::vector<mx::array> at{rows, positions};
  auto put = [&](const mx::array& cache, const mx::array& e) {
    return mx::scatter(cache, at, mx::reshape(mx::astype(e, cache.dtype(), cpu()), entries, cpu()), {0, 1}, cpu());
  };
  return {put(keys, k), put(values, v)};
}

mx::array layer_out(const mx::array& h, const mx::array& q, const mx::array& keys, const mx::array& values,
                    const mx::array& rows, const mx::array& positions, float attn_scale, const mx::array& o_packed,
                    int o_type, int o_group, const std::vector<mx::array>& o_bias, const mx::array& norm2, float eps2,
                    const std::vector<mx::array>& gate_up, const std::vector<int>& gu_types,
                    const std::vector<int>& gu_groups, int ffn, const mx::array& down_packed, int down_type,
                    int down_group, const std::vector<mx::array>& down_bias) {
  if (h.ndim() < 2 || q.ndim() != 3 || keys.ndim() != 4 || keys.shape() != values.shape())
    throw std::invalid_argument("layer_out: h [..., n, K], q [n, hq, d], keys/values [P, capacity, hkv, d]");
  const int K = h.shape(-1), n = q.shape(0), hq = q.shape(1), d = q.shape(2), hkv = keys.shape(2);
  if (int(h.size() / K) != n || keys.shape(3) != d || hq % hkv)
    throw std::invalid_argument("layer_out: h, q and the cache do not agree");
  if (gate_up.size() != 2 || gu_types.size() != 2 || gu_groups.size() != 2 || o_bias.size() > 1 ||
      down_bias.size() > 1)
    throw std::invalid_argument("layer_out: two packed matrices (gate, up), at most one bias each for o and down");
  check_packed(o_packed, o_type, o_group, K, hq * d);
  for (int i = 0; i < 2; ++i) check_packed(gate_up[i], gu_types[i], gu_groups[i], ffn, K);
  check_packed(down_packed, down_type, down_group, K, ffn);
  check_vector(norm2, K, "layer_out: norm2");
  check_vector(rows, n, "layer_out: rows");
  check_vector(positions, n, "layer_out: positions");
  std::vector<mx::array> inputs{f32(h),        f32(q),     f32(keys),  f32(values), i32(rows),  i32(positions),
                                o_packed,      f32(norm2), gate_up[0], gate_up[1],  down_packed};
  for (const auto* b : {&o_bias, &down_bias})
    if (!b->empty()) {
      check_vector((*b)[0], K, "layer_out: bias");
      inputs.push_back(f32((*b)[0]));
    }
  auto prim = std::make_shared<LayerOutP>(cpu(), OutParams{attn_scale, o_type, o_group, eps2, gu_types, gu_groups,
                                                           ffn, down_type, down_group, !o_bias.empty(),
                                                           !down_bias.empty()});
  return mx::array(h.shape(), mx::float32, prim, inputs);
}

}  // namespace mlxcel_q
