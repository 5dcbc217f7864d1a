// AVX-512 (F, BW, VL) + VNNI kernel: the vector operations are in v_avx512.h.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "unit.h"

namespace mlxcel_q::avx512 {

#include "v_avx512.h"

#define MAXR_8 1
#include "kernel_body.h"

}  // namespace mlxcel_q::avx512
