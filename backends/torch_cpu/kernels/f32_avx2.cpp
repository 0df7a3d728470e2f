// float32 weights times float32 x on AVX2 CPUs (e.g. Zen 3), on f32_avx512.cpp's blocked layout
// [blocks, K, 16 rows], each block's 16 outputs as two 8-wide halves. As there, each output is one
// chain of multiply-adds over k = 0 .. K-1 in order, whatever the number of rows of x or how the
// threads split the blocks, so a row's result depends on that row alone (batch invariance:
// oneDNN's float32 linear adds up in other orders at one row than at several, and a seeded
// request's draw then depends on who else is decoding).
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace {

// NB consecutive blocks for MT rows of x: 2 * NB * MT accumulators, within AVX2's 16 registers
// beside the weights (NB = 2, MT = 2: 8 accumulators, 4 weight vectors, one broadcast).
template <int NB, int MT>
void f32b_tile(const float* x, int64_t K, const float* block, float* y, int64_t N, int64_t n0) {
  __m256 acc[NB][2][MT];
  for (int j = 0; j < NB; j++)
    for (int h = 0; h < 2; h++)
      for (int m = 0; m < MT; m++) acc[j][h][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    __m256 w[NB][2];
    for (int j = 0; j < NB; j++) {
      w[j][0] = _mm256_loadu_ps(block + (j * K + k) * 16);
      w[j][1] = _mm256_loadu_ps(block + (j * K + k) * 16 + 8);
    }
    for (int m = 0; m < MT; m++) {
      const __m256 xm = _mm256_set1_ps(x[m * K + k]);
      for (int j = 0; j < NB; j++)
        for (int h = 0; h < 2; h++) acc[j][h][m] = _mm256_fmadd_ps(w[j][h], xm, acc[j][h][m]);
    }
  }
  for (int j = 0; j < NB; j++)
    for (int h = 0; h < 2; h++) {
      const int64_t first = n0 + 16 * j + 8 * h, left = N - first;
      if (left <= 0) continue;
      for (int m = 0; m < MT; m++) {
        if (left >= 8) {
          _mm256_storeu_ps(y + m * N + first, acc[j][h][m]);
        } else {  // the last block's padding rows are not outputs
          alignas(32) float lanes[8];
          _mm256_store_ps(lanes, acc[j][h][m]);
          std::copy(lanes, lanes + left, y + m * N + first);
        }
      }
    }
}

template <int NB>
void rows_of(const float* x, int64_t M, int64_t K, const float* w, float* y, int64_t N, int64_t b) {
  int64_t m0 = 0;
  for (; m0 + 2 <= M; m0 += 2) f32b_tile<NB, 2>(x + m0 * K, K, w + b * K * 16, y + m0 * N, N, b * 16);
  if (m0 < M) f32b_tile<NB, 1>(x + m0 * K, K, w + b * K * 16, y + m0 * N, N, b * 16);
}

void f32b_range(const float* x, int64_t M, int64_t K, const float* w, float* y, int64_t N, int64_t b_begin,
                int64_t b_end) {
  for (int64_t b = b_begin; b < b_end; b += 2) {
    if (b + 1 < b_end) rows_of<2>(x, M, K, w, y, N, b);
    else rows_of<1>(x, M, K, w, y, N, b);
  }
}

}  // namespace
#pragma GCC pop_options

void f32b_matmul_avx2(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  at::parallel_for(0, (N + 15) / 16, 2, [&](int64_t b, int64_t e) { f32b_range(x, M, K, w, y, N, b, e); });
}

}  // namespace qs
