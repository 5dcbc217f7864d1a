// Python bindings (nanobind, in MLX's domain so mlx.core.array passes through unchanged).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdlib>
#include <cstring>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "mlx/mlx.h"
#include "mlx/version.h"
#include "fkernel.h"
#include "fused.h"
#include "layer.h"
#include "ops.h"
#include "repack.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace mx = mlx::core;

namespace {

mx::array host_contiguous(const mx::array& a) {
  auto c = mx::contiguous(a, false, mx::Device::cpu);
  mx::eval(c);
  return c;
}

// A packed weight's buffer: 64-byte aligned (each of the kernels' 64-byte loads in one cache line)
// and advised for transparent huge pages before anything writes it (one TLB entry per 2 MB of a
// stream read once per step). The pointer constructor mx::array(void*, ...) copies the bytes into
// MLX's own allocation on the CPU, which starts 24 bytes past a page: every 64-byte load of the
// weights spanned two cache lines, on 4 KB pages. So the buffer comes from MLX's allocator with
// 64 bytes of slack, and the array is a view of it at an offset (no copy; loading got cheaper
// too). One-row products with the weights streamed from memory, Zen 4, median of 6 rounds:
// Q4_K 8960 x 1536 0.535 -> 0.433 ms, Q6_K 8960 x 1536 0.948 -> 0.804 (docs/benchmarks.md).
constexpr size_t HUGE_PAGE = size_t(2) << 20;

template <typename Fill>
mx::array packed_array(size_t nbytes, Fill fill) {
  auto data = mx::allocator::malloc(nbytes + 64);
  auto* raw = static_cast<uint8_t*>(data.buffer().raw_ptr());
  const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
  int64_t offset = int64_t((64 - at % 64) % 64);
#if defined(__linux__)
  const uintptr_t lo = (at + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), hi = (at + nbytes) & ~(HUGE_PAGE - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // advice only
#endif
  fill(raw + offset);  // data frees the buffer if this throws
  mx::array whole(std::move(data), {int(nbytes + 64)}, mx::uint8);
  auto view = mx::slice(whole, {int(offset)}, {int(offset + nbytes)}, mx::Device::cpu);
  mx::eval(view);  // a view of whole's buffer (no copy)
  return view;
}

mx::array repack_gguf(const mx::array& raw, int type, int n, int k) {
  if (raw.dtype() != mx::uint8 || raw.nbytes() != mlxcel_q::gguf_row_bytes(type, k) * size_t(n))
    throw std::invalid_argument("raw GGUF bytes do not match the type and shape");
  auto r = host_contiguous(raw);
  mlxcel_q::Layout l = mlxcel_q::layout_of(type, 0);
  size_t nbytes = mlxcel_q::packed_bytes(l, n, k);
  return packed_array(nbytes, [&](uint8_t* p) { mlxcel_q::repack_gguf(type, r.data<uint8_t>(), n, k, p); });
}

mx::array repack_affine(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits, int group,
                        int n, int k) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("affine bits must be 4 or 8");
  if (w.dtype() != mx::uint32 || w.size() != size_t(n) * k * bits / 32)
    throw std::invalid_argument("affine weight does not match the shape");
  if (k % group || scales.size() != size_t(n) * (k / group) || biases.size() != scales.size())
    throw std::invalid_argument("affine scales/biases do not match the shape");
  auto wc = host_contiguous(w);
  auto sc = host_contiguous(mx::astype(scales, mx::float32, mx::Device::cpu));
  auto bc = host_contiguous(mx::astype(biases, mx::float32, mx::Device::cpu));
  mlxcel_q::Layout l = mlxcel_q::layout_of(bits == 4 ? mlxcel_q::AFFINE4 : mlxcel_q::AFFINE8, group);
  size_t nbytes = mlxcel_q::packed_bytes(l, n, k);
  return packed_array(nbytes, [&](uint8_t* p) {
    mlxcel_q::repack_affine(bits, group, wc.data<uint32_t>(), sc.data<float>(), bc.data<float>(), n, k, p);
  });
}

mx::array repack_float(const mx::array& w, int n, int k) {
  if (w.ndim() != 2 || w.shape(0) != n || w.shape(1) != k)
    throw std::invalid_argument("float weight does not match the shape");
  auto wc = host_contiguous(mx::astype(w, mx::float32, mx::Device::cpu));
  size_t nbytes = mlxcel_q::packed_bytes(mlxcel_q::layout_of(mlxcel_q::F32, 0), n, k);
  return packed_array(nbytes, [&](uint8_t* p) { mlxcel_q::repack_float(wc.data<float>(), n, k, reinterpret_cast<float*>(p)); });
}

}  // namespace

NB_MODULE(_qmatmul, m) {
  m.doc() = "mlxcel's CPU kernels for quantized weights (see engine/platform/qmatmul_src/layout.h)";
  m.def("qmatmul", &mlxcel_q::qmatmul, "x"_a, "packed"_a, "type"_a, "group"_a, "n"_a, "k"_a,
        "x[..., k] @ W[n, k].T for a packed W: [..., n]");
  m.def("qmatmul_multi", &mlxcel_q::qmatmul_multi, "x"_a, "packed"_a, "types"_a, "groups"_a, "ns"_a, "k"_a,
        "[x @ W_i.T for each packed W_i], x quantized once: bitwise each qmatmul(x, W_i)");
  m.def("dequant_rows", &mlxcel_q::dequant_rows, "ids"_a, "packed"_a, "type"_a, "group"_a, "n"_a, "k"_a,
        "rows ids of a packed W, dequantized to float32");
  m.def("repack_gguf", &repack_gguf, "raw"_a, "type"_a, "n"_a, "k"_a, "GGUF blocks [n, row_bytes] -> packed");
  m.def("repack_affine", &repack_affine, "w"_a, "scales"_a, "biases"_a, "bits"_a, "group"_a, "n"_a, "k"_a,
        "MLX affine (uint32 weight, scales, biases) -> packed");
  m.def("repack_float", &repack_float, "w"_a, "n"_a, "k"_a, "float W[n, k] (any float dtype) -> packed float32 tiles");
  m.def("swiglu", &mlxcel_q::swiglu, "gate"_a, "x"_a);
  m.def("argmax_rows", &mlxcel_q::argmax_rows, "x"_a);
  m.def("rms_norm", &mlxcel_q::rms_norm, "x"_a, "weight"_a, "eps"_a);
  m.def("rope", &mlxcel_q::rope, "x"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a, "offset"_a);
  m.def("attention", &mlxcel_q::attention, "q"_a, "k"_a, "v"_a, "scale"_a, "causal"_a);
  m.def("layer_in", &mlxcel_q::layer_in, "h"_a, "norm"_a, "eps"_a, "packed"_a, "types"_a, "groups"_a, "ns"_a,
        "biases"_a, "positions"_a, "n_heads"_a, "n_kv_heads"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a,
        "a ragged decoder layer's norm, q/k/v products (+ biases) and rope: [q, k, v] (layer.h)");
  m.def("cache_write", &mlxcel_q::cache_write, "keys"_a, "values"_a, "rows"_a, "positions"_a, "k"_a, "v"_a,
        "[keys, values] with entry j of k/v at place rows[j], position positions[j] (layer.h)");
  m.def("layer_out", &mlxcel_q::layer_out, "h"_a, "q"_a, "keys"_a, "values"_a, "rows"_a, "positions"_a,
        "attn_scale"_a, "o_packed"_a, "o_type"_a, "o_group"_a, "o_bias"_a, "norm2"_a, "eps2"_a, "gate_up"_a,
        "gu_types"_a, "gu_groups"_a, "ffn"_a, "down_packed"_a, "down_type"_a, "down_group"_a, "down_bias"_a,
        "a ragged decoder layer's attention over the cache, o, residual, MLP and residual (layer.h)");
  m.def("ragged_attention", &mlxcel_q::ragged_attention, "q"_a, "k"_a, "v"_a, "rows"_a, "positions"_a, "scale"_a);
  m.def("rope_positions", &mlxcel_q::rope_positions, "x"_a, "positions"_a, "dims"_a, "traditional"_a, "base"_a,
        "scale"_a);
  m.def("packed_nbytes", [](int type, int group, int n, int k) {
    return mlxcel_q::packed_bytes(mlxcel_q::layout_of(type, group), n, k);
  });
  m.def("set_num_threads", &mlxcel_q::set_num_threads, "n"_a);
  m.def("num_threads", &mlxcel_q::num_threads);
  m.def("pool_check", &mlxcel_q::pool_check, "calls"_a, "spin"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("set_thread_split", &mlxcel_q::set_thread_split, "grain_macs"_a, "wake_macs"_a);
  m.def("isa", &mlxcel_q::isa);
  m.def("set_isa", &mlxcel_q::set_isa, "name"_a);
  m.def("available_isas", &mlxcel_q::available_isas);
  m.attr("MLX_VERSION") = std::to_string(MLX_VERSION_MAJOR) + "." + std::to_string(MLX_VERSION_MINOR) + "." +
                          std::to_string(MLX_VERSION_PATCH);
}
