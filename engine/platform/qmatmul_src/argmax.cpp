// The index of each row's largest value: what greedy decoding and every greedy verify round ask of
// the logits. MLX's CPU argmax walks a row one element at a time (a compare and a branch each):
// 58 us for one row of a 49152-word vocabulary, 1.9 ms for a 33-row verify block (2-core Sapphire
// Rapids guest). Here a row is two vectorized passes (its largest value, then the first index that
// holds it), and a block's rows are split among the kernel threads.
//
// The answer is MLX's (0.32), element for element: a NaN counts as larger than any number, so the
// first NaN of a row is its answer; otherwise the first index that holds the row's largest value (of
// equal largest values, +0 and -0 included, the first wins). tests/engine/platform/test_argmax.py
// compares the two on NaNs, infinities, ties and signed zeros, so a change in MLX's rule shows there.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "mlx/backend/cpu/encoder.h"
#include "fused.h"
#include "ops.h"

namespace mlxcel_q {
namespace {

uint32_t argmax_portable(const float* x, int64_t n) {
  float top = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(x[j])) return uint32_t(j);
    top = std::max(top, x[j]);
  }
  for (int64_t j = 0; j < n; ++j)
    if (x[j] == top) return uint32_t(j);
  return 0;  // not reached: top is one of the values
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint32_t argmax_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    if (const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return uint32_t(j + __builtin_ctz(nan));
    m = _mm512_max_ps(v, m);
  }
  float top = _mm512_reduce_max_ps(m);
  for (int64_t i = j; i < n; ++i) {
    if (std::isnan(x[i])) return uint32_t(i);
    top = std::max(top, x[i]);
  }
  const __m512 t = _mm512_set1_ps(top);
  for (j = 0; j + 16 <= n; j += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), t, _CMP_EQ_OQ);
    if (eq) return uint32_t(j + __builtin_ctz(eq));
  }
  for (; j < n; ++j)
    if (x[j] == top) return uint32_t(j);
  return 0;  // not reached: top is one of the values
}
#endif

using RowFn = uint32_t (*)(const float*, int64_t);

RowFn row_fn() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return argmax_avx512;
#endif
  return argmax_portable;
}

class ArgmaxRowsP : public mx::UnaryPrimitive {
 public:
  explicit ArgmaxRowsP(mx::Stream s) : mx::UnaryPrimitive(s) {}
  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(in[0]);
    enc.set_output_array(out);
    const int64_t n = in[0].shape(-1);
    enc.dispatch([x = in[0].data<float>(), o = out.data<uint32_t>(), rows = int(out.size()), n]() {
      static const RowFn fn = row_fn();
      auto some = [=](int r0, int r1) {
        for (int r = r0; r < r1; ++r) o[r] = fn(x + int64_t(r) * n, n);
      };
      split_units(rows, size_t(rows) * n, some);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override { throw std::runtime_error("CPU only"); }
  const char* name() const override { return "MlxcelArgmaxRows"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    mx::Shape s = in[0].shape();
    s.pop_back();
    return {s};
  }
};

}  // namespace

mx::array argmax_rows(const mx::array& x) {
  if (x.ndim() < 1 || x.shape(-1) < 1) throw std::invalid_argument("argmax_rows: x must be [..., n] with n >= 1");
  mx::Shape shape = x.shape();
  shape.pop_back();
  auto xc = mx::contiguous(f32(x), false, cpu());
  return mx::array(shape, mx::uint32, std::make_shared<ArgmaxRowsP>(cpu()), {xc});
}

}  // namespace mlxcel_q
