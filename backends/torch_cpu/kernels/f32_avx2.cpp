// float32 or bfloat16 weights times float32 x on AVX2 CPUs (e.g. Zen 3), on f32_avx512.cpp's blocked
// layout [blocks, K, 16 rows], each block's 16 outputs as two 8-wide halves; a bfloat16 weight is
// widened in registers (a 16-bit shift), since AVX2 CPUs have no bf16 arithmetic and torch's bf16
// GEMM took ~0.8 s per Qwen3.5-0.8B decode step on a Zen 3. As there, each output is one
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

inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const uint16_t* w) {  // bfloat16 -> float32 is a 16-bit shift
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// NB consecutive blocks for MT rows of x: 2 * NB * MT accumulators, within AVX2's 16 registers
// beside the weights (NB = 2, MT = 2: 8 accumulators, 4 weight vectors, one broadcast).
template <typename W, int NB, int MT>
void f32b_tile(const float* x, int64_t K, const W* block, float* y, int64_t N, int64_t n0) {
  __m256 acc[NB][2][MT];
  for (int j = 0; j < NB; j++)
    for (int h = 0; h < 2; h++)
      for (int m = 0; m < MT; m++) acc[j][h][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    __m256 w[NB][2];
    for (int j = 0; j < NB; j++) {
      w[j][0] = load8(block + (j * K + k) * 16);
      w[j][1] = load8(block + (j * K + k) * 16 + 8);
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

template <typename W, int NB>
void rows_of(const float* x, int64_t M, int64_t K, const W* w, float* y, int64_t N, int64_t b) {
  int64_t m0 = 0;
  for (; m0 + 2 <= M; m0 += 2) f32b_tile<W, NB, 2>(x + m0 * K, K, w + b * K * 16, y + m0 * N, N, b * 16);
  if (m0 < M) f32b_tile<W, NB, 1>(x + m0 * K, K, w + b * K * 16, y + m0 * N, N, b * 16);
}

template <typename W>
void blocked_range(const float* x, int64_t M, int64_t K, const W* w, float* y, int64_t N, int64_t b_begin,
                   int64_t b_end) {
  for (int64_t b = b_begin; b < b_end; b += 2) {
    if (b + 1 < b_end) rows_of<W, 2>(x, M, K, w, y, N, b);
    else rows_of<W, 1>(x, M, K, w, y, N, b);
  }
}

}  // namespace
#pragma GCC pop_options

void f32b_matmul_avx2(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  at::parallel_for(0, (N + 15) / 16, 2, [&](int64_t b, int64_t e) { blocked_range(x, M, K, w, y, N, b, e); });
}

void bf16c_matmul_avx2(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, float* y) {
  at::parallel_for(0, (N + 15) / 16, 2, [&](int64_t b, int64_t e) { blocked_range(x, M, K, w, y, N, b, e); });
}

}  // namespace qs
