// Float32 weights in the packed tile family (layout.h's type F32): W[n, k] re-laid at load as
// tiles of 16 output features, each tile k rows of 16 contiguous floats (tile[k * 16 + c] =
// W[16 t + c][k]; the last tile's missing features are zeros), so one 64-byte load is one input's
// weight for the tile's 16 features. The kernel streams each tile once per call and applies it
// to every row by one fused multiply-add per (row, input, feature), in order of k from a zero
// accumulator: a row's result is the same bits whatever the number of rows, the threads and the
// ISA (the scalar code uses std::fma in the same order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mlxcel_q {

// One ISA's float kernel: out[m, n] (row stride n) for tiles [t0, t1) of the packed matrix;
// x is [m, k] row-major.
using FloatKernel = void (*)(const float* packed, int n, int k, const float* x, int m, float* out, int t0, int t1);

namespace scalar { void fmatmul(const float*, int, int, const float*, int, float*, int, int); }
#if defined(__x86_64__) || defined(_M_X64)
namespace avx2 { void fmatmul(const float*, int, int, const float*, int, float*, int, int); }
namespace avx512 { void fmatmul(const float*, int, int, const float*, int, float*, int, int); }
#endif
#if defined(__aarch64__)
namespace neon { void fmatmul(const float*, int, int, const float*, int, float*, int, int); }
#endif

// The float kernel going with an ISA name of ops.cpp ("avx512_vnni", "avx2", "neon", "scalar").
FloatKernel float_kernel_for(const std::string& isa);
// w: float32 [n, k] row-major; out: packed_bytes(layout_of(F32), n, k) bytes.
void repack_float(const float* w, int n, int k, float* out);
// Rows ids of the packed float matrix (an embedding lookup); out-of-range ids give zeros.
void float_rows(const float* packed, int n, int k, const int32_t* ids, int count, float* out);

}  // namespace mlxcel_q
