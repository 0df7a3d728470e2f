/* cblas_sgemm for mlx[cpu] on Linux, forwarded to OpenBLAS (the scipy-openblas32 wheel).
 *
 * mlx[cpu]'s Linux wheels bundle the netlib reference BLAS, whose sgemm is a plain triple loop:
 * every float32 matmul MLX runs on the CPU goes through it. This library is loaded with
 * RTLD_GLOBAL before mlx.core, so the dynamic linker binds MLX's undefined cblas_sgemm here
 * (the global scope is searched before a library's own dependencies). OpenBLAS's symbols carry
 * a "scipy_" prefix so that they never interpose anyone else's; this is the one we want. */
#include <stdint.h>

void scipy_cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

static uint64_t calls;

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* How many sgemm calls came through here: lets a test see that MLX really uses this library. */
uint64_t qwen_serve_sgemm_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }
