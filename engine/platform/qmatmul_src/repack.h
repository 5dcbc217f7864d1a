#pragma once

#include <cstddef>
#include <cstdint>

#include "layout.h"

namespace mlxcel_q {

size_t gguf_row_bytes(int type, int k);
// raw: the tensor's GGUF bytes, n rows of gguf_row_bytes(type, k); out: packed_bytes(layout_of(type), n, k).
void repack_gguf(int type, const uint8_t* raw, int n, int k, uint8_t* out);
// MLX affine: w uint32 [n, k * bits / 32], scales and biases float32 [n, k / group].
void repack_affine(int bits, int group, const uint32_t* w, const float* scales, const float* biases, int n, int k,
                   uint8_t* out);
// Rows `ids` of the matrix, dequantized to float32 (an embedding lookup); out-of-range ids give zeros.
void dequantize_rows(const Layout& l, const uint8_t* packed, int n, int k, const int32_t* ids, int count,
                     float* out);

}  // namespace mlxcel_q
