// MLX operations over packed weights: the primitives' graph-building side.
#pragma once

#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxcel_q {

namespace mx = mlx::core;

// x[..., k] (float) times the packed matrix W[n, k] transposed: [..., n] float32, on the CPU.
mx::array qmatmul(const mx::array& x, const mx::array& packed, int type, int group, int n, int k);
// The same x times several packed matrices W_i[n_i, k] (q/k/v, gate/up): x quantized once, one
// primitive, one pass of the threads; output i is bitwise what qmatmul(x, W_i) gives.
std::vector<mx::array> qmatmul_multi(const mx::array& x, const std::vector<mx::array>& packed,
                                     const std::vector<int>& types, const std::vector<int>& groups,
                                     const std::vector<int>& ns, int k);
// Rows ids (any shape, integer) of W, dequantized: ids.shape + [k] float32 (an embedding lookup).
mx::array dequant_rows(const mx::array& ids, const mx::array& packed, int type, int group, int n, int k);

// The evaluation of qmatmul_multi over raw buffers: x's m rows (strided: gathered by shape/strides)
// times each packed W_i[ns[i], k] into ops[i] (m x ns[i]), on the kernel threads. For primitives
// that chain products inside one evaluation (layer.cpp); the same bits as qmatmul_multi / qmatmul.
void products_into(const float* xp, int m, int k, bool strided, const mx::Shape& shape, const mx::Strides& strides,
                   const std::vector<const uint8_t*>& wps, const std::vector<int>& types,
                   const std::vector<int>& groups, const std::vector<int>& ns, const std::vector<float*>& ops);

// Gives `out` (row-contiguous) a new buffer whose data starts on a 64-byte boundary. The kernels
// write a tile's 16 outputs of a row as one 64-byte store; MLX's CPU buffers start 8 or 24 bytes past
// one, so each such store split over two cache lines, and at the boundary between two threads' tiles
// both threads wrote the same line (Q4_1 1536 x 576 at 122 rows, two threads: 0.65 ms a call; with
// the stores kept apart, 0.44).
void set_aligned_data(mx::array& out);

// Throws std::invalid_argument unless packed holds W[n, k] of that type and group.
void check_packed(const mx::array& packed, int type, int group, int n, int k);

void set_num_threads(int n);
// Multiply-adds per grain of a split call, and the size under which a call does not wake sleeping
// workers (defaults MLXCEL_GRAIN_MACS / MLXCEL_WAKE_MACS); returns the previous pair. The tests
// split every call.
std::vector<size_t> set_thread_split(size_t grain_macs, size_t wake_macs);
int num_threads();
// fn(u0, u1) over [0, units) split among the kernel threads as a matmul's tiles are (grains of
// about MLXCEL_GRAIN_MACS of the call's macs multiply-adds; a call of one grain runs on the caller
// alone); returns when every unit is done. The fused ops thread their heads with it.
void parallel_for(int units, size_t macs, const std::function<void(int, int)>& fn);
// parallel_for for row code: a call of one unit (a one-token step's norm, rope, quantization) runs
// fn on the caller directly, without building the std::function a pool call takes.
template <class F>
void split_units(int units, size_t macs, F&& fn) {
  if (units <= 1) return fn(0, units);
  parallel_for(units, macs, fn);
}
// Test: `calls` back-to-back pool calls of alternating grain counts, `spin` busy steps a unit; how many computed a unit other than once.
long pool_check(int calls, int spin);
// "avx512_vnni", "avx2", "neon" or "scalar": the kernel in use; set_isa("auto") picks the best present.
std::string isa();
void set_isa(const std::string& name);
std::string available_isas();

class QMatmul : public mx::UnaryPrimitive {
 public:
  QMatmul(mx::Stream s, int type, int group, int n, int k)
      : mx::UnaryPrimitive(s), type_(type), group_(group), n_(n), k_(k) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxcelQMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int type_, group_, n_, k_;
};

class QMatmulMulti : public mx::Primitive {
 public:
  QMatmulMulti(mx::Stream s, std::vector<int> types, std::vector<int> groups, std::vector<int> ns, int k)
      : mx::Primitive(s), types_(std::move(types)), groups_(std::move(groups)), ns_(std::move(ns)), k_(k) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "MlxcelQMatmulMulti"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  std::vector<int> types_, groups_, ns_;
  int k_;
};

class DequantRows : public mx::UnaryPrimitive {
 public:
  DequantRows(mx::Stream s, int type, int group, int n, int k)
      : mx::UnaryPrimitive(s), type_(type), group_(group), n_(n), k_(k) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "MlxcelDequantRows"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int type_, group_, n_, k_;
};

}  // namespace mlxcel_q
