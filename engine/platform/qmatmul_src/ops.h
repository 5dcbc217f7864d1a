// MLX operations over packed weights: the primitives' graph-building side.
#pragma once

#include <string>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxcel_q {

namespace mx = mlx::core;

// x[..., k] (float) times the packed matrix W[n, k] transposed: [..., n] float32, on the CPU.
mx::array qmatmul(const mx::array& x, const mx::array& packed, int type, int group, int n, int k);
// Rows ids (any shape, integer) of W, dequantized: ids.shape + [k] float32 (an embedding lookup).
mx::array dequant_rows(const mx::array& ids, const mx::array& packed, int type, int group, int n, int k);

void set_num_threads(int n);
int num_threads();
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
