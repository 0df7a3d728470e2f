// float32 weights times float32 x, weight layout [blocks, K, 16 rows]: the float32 linears on
// AVX-512 CPUs. Each output is one chain of multiply-adds over k = 0 .. K-1 in order, whatever
// the number of rows of x or how the threads split the blocks, so a row's result depends on that
// row alone (batch invariance: oneDNN took a matrix-vector path at one row and blocked GEMMs from
// two on, which add up in other orders, and padding one row to four to avoid it halved batch-1
// decode). Decode reads the weights once per call however many rows x has.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace {

// NB consecutive blocks (16 * NB outputs) for MT rows of x: NB * MT independent chains, each
// broadcast of x feeding NB multiply-adds.
template <int NB, int MT>
void f32b_tile(const float* x, int64_t K, const float* block, float* y, int64_t N, int64_t n0) {
  __m512 acc[NB][MT];
  for (int j = 0; j < NB; j++)
    for (int m = 0; m < MT; m++) acc[j][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    __m512 w[NB];
    for (int j = 0; j < NB; j++) w[j] = _mm512_loadu_ps(block + (j * K + k) * 16);
    for (int m = 0; m < MT; m++) {
      const __m512 xm = _mm512_set1_ps(x[m * K + k]);
      for (int j = 0; j < NB; j++) acc[j][m] = _mm512_fmadd_ps(w[j], xm, acc[j][m]);
    }
  }
  store_tile<NB, MT>(acc, y, N, n0);
}

constexpr int64_t PANEL_BYTES = 256 << 10;  // of weights (each_panel_tile)

void f32b_range(const float* x, int64_t M, int64_t K, const float* w, float* y, int64_t N, int64_t b_begin,
                int64_t b_end) {
  const int64_t panel = std::max<int64_t>(1, PANEL_BYTES / (K * 16 * 4 * 3)) * 3;
  each_panel_tile(M, b_begin, b_end, panel, [&](int64_t m0, auto rows, int64_t b, auto blocks) {
    f32b_tile<decltype(blocks)::value, decltype(rows)::value>(x + m0 * K, K, w + b * K * 16, y + m0 * N, N, b * 16);
  });
}

}  // namespace
#pragma GCC pop_options

void f32b_matmul_avx512(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  at::parallel_for(0, (N + 15) / 16, 3, [&](int64_t b, int64_t e) { f32b_range(x, M, K, w, y, N, b, e); });
}

}  // namespace qs
