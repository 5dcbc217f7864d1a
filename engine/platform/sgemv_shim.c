/* mlxcel's one-row matmul shim for MLX's Linux CPU backend.
 *
 * MLX's CPU matmul always calls cblas_sgemm, also for a decode step's one-row products
 * (x[1, K] @ W[N, K]^T). OpenBLAS's sgemm packs W into panels first, which for one row costs
 * more than the product: on a 2-core x86-64 box it streams a 49152 x 576 output head at ~5 GB/s,
 * while cblas_sgemv reads the same matrix at ~13 GB/s. This library, preloaded ahead of
 * OpenBLAS, defines cblas_sgemm, sends row-major calls with M == 1 to the next library's
 * cblas_sgemv, and everything else to the next library's cblas_sgemm unchanged.
 *
 * Built at run time by engine/platform/blas_shim.py (no compiler: no shim, nothing else changes).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

enum { ROW_MAJOR = 101 };
enum { NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

static sgemm_fn next_sgemm;
static sgemv_fn next_sgemv;

/* One-row calls answered with sgemv so far (read by the tests through ctypes), and a switch a
 * benchmark flips through ctypes to compare both paths in one process (nonzero: all to sgemm). */
long mlxcel_sgemv_calls;
int mlxcel_sgemv_off;

/* Resolved once when the library is loaded, before any thread can call in. */
__attribute__((constructor)) static void resolve_next(void) {
  next_sgemv = (sgemv_fn)dlsym(RTLD_NEXT, "cblas_sgemv");
  next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  if (next_sgemm == NULL) /* a library loaded after us: resolve now */
    resolve_next();
  if (order == ROW_MAJOR && m == 1 && next_sgemv != NULL && !mlxcel_sgemv_off) {
    /* c[1, n] = alpha * a[1, k] . op(b) + beta * c.  a's k elements are contiguous when a is not
     * transposed, and lda apart when it is (a is then k x 1).  op(b) = b^T: b is n x k (row-major,
     * leading dimension ldb) and c = b . a;  op(b) = b: b is k x n and c = b^T . a. */
    int inc_a = trans_a == NO_TRANS ? 1 : lda;
    if (trans_b == TRANS)
      next_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, a, inc_a, beta, c, 1);
    else
      next_sgemv(ROW_MAJOR, TRANS, k, n, alpha, b, ldb, a, inc_a, beta, c, 1);
    mlxcel_sgemv_calls++;
    return;
  }
  next_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
