// A llama-style decoder layer of the ragged forward (engine/decode/ragged.py) as two primitives
// around the KV-cache write, instead of about twenty: on a small model each MLX primitive's fixed
// cost (graph building in Python, MLX's dispatch and allocation) was most of a decode step.
// Each chains the fused ops' own row code and the matmul kernels (rows.h, ops.h) in the order the
// unfused layer runs them, with the same float additions for biases and residuals, so a row gets
// the same bits as from the separate primitives.
#pragma once

#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mlxcel_q {

namespace mx = mlx::core;

// The layer's first half for h [..., n, K] (n tokens flat): x = rms_norm(h, norm, eps), the q/k/v
// products of x (packed W_q/W_k/W_v, types/groups/ns), plus their biases when `biases` holds three,
// q and k rotated at `positions` (int32 [n]). Returns q [n, hq, d], k [n, hkv, d], v [n, hkv, d].
std::vector<mx::array> layer_in(const mx::array& h, const mx::array& norm, float eps,
                                const std::vector<mx::array>& packed, const std::vector<int>& types,
                                const std::vector<int>& groups, const std::vector<int>& ns,
                                const std::vector<mx::array>& biases, const mx::array& positions, int hq, int hkv,
                                int dims, bool traditional, float base, float scale);

// The cache write between the halves: entry j of k/v [n, hkv, d] stored in keys/values [P,
// capacity, hkv, d] at place rows[j], position positions[j]. MLX's own scatter (what
// `keys[rows, positions] = k` builds in Python, with its buffer donation), from one call.
// Returns the new keys and values.
std::vector<mx::array> cache_write(const mx::array& keys, const mx::array& values, const mx::array& rows,
                                   const mx::array& positions, const mx::array& k, const mx::array& v);

// The second half: a = ragged attention of q [n, hq, d] over the cache keys/values [P, capacity,
// hkv, d] (token-major, as RaggedKVCache stores them) for rows/positions (int32 [n]); h1 = h +
// (a W_o^T [+ o_bias]); returns h1 + (swiglu(gate, up of rms_norm(h1, norm2, eps2)) W_down^T
// [+ down_bias]), shaped like h. `o` / `down`: (type, group) of the packed matrices; an empty bias
// list means none.
mx::array layer_out(const mx::array& h, const mx::array& q, const mx::array& keys, const mx::array& values,
                    const mx::array& rows, const mx::array& positions, float attn_scale, const mx::array& o_packed,
                    int o_type, int o_group, const std::vector<mx::array>& o_bias, const mx::array& norm2, float eps2,
                    const std::vector<mx::array>& gate_up, const std::vector<int>& gu_types,
                    const std::vector<int>& gu_groups, int ffn, const mx::array& down_packed, int down_type,
                    int down_group, const std::vector<mx::array>& down_bias);

}  // namespace mlxcel_q
