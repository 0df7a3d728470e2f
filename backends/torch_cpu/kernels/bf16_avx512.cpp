// bfloat16 weights times float32 x with float32 results, weight layout [blocks, K/2, 16 rows, 2]:
// every bf16 linear on AVX-512 CPUs without AMX, and the lm_head everywhere, whose logits must
// stay float32 (rounded to bf16, the top two logits of SmolLM2 tied). With AVX512-BF16, x is
// rounded to bf16 here and vdpbf16ps multiplies pairs; without it (an Ice Lake, a Zen 3) each
// weight pair is widened to float32 with two shifts and x stays float32, two multiply-adds where
// vdpbf16ps does one: decode reads the same bytes either way, and the alternative there was
// converting the whole weight to float32 on every call. y is not rounded at all.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
namespace {

// NB consecutive blocks (16 * NB outputs) for MT rows of x: each broadcast of x feeds NB
// multiply-adds and the NB * MT accumulators are independent chains. With one block per tile the
// kernel waited on vdpbf16ps's latency: 4 Qwen3-0.6B layers at 8 rows took 9.1 ms, 5.2 with three
// (benchmarks/bench_linears.py, Zen 4).
template <int NB, int MT>
void bf16b_tile(const uint32_t* xpairs, int64_t K, const uint16_t* block, float* y, int64_t N, int64_t n0) {
  __m512 acc[NB][MT];
  for (int j = 0; j < NB; j++)
    for (int m = 0; m < MT; m++) acc[j][m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < K / 2; p++) {
    __m512bh w[NB];
    for (int j = 0; j < NB; j++) w[j] = (__m512bh)_mm512_loadu_si512(block + j * K * 16 + p * 32);
    for (int m = 0; m < MT; m++) {
      const __m512bh xm = (__m512bh)_mm512_set1_epi32(xpairs[m * (K / 2) + p]);
      for (int j = 0; j < NB; j++) acc[j][m] = _mm512_dpbf16_ps(acc[j][m], w[j], xm);
    }
  }
  store_tile<NB, MT>(acc, y, N, n0);
}

}  // namespace
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace {

// The same tile without AVX512-BF16: x float32 [MT, K], each weight pair widened to float32.
template <int NB, int MT>
void bf16b_tile_widened(const float* x, int64_t K, const uint16_t* block, float* y, int64_t N, int64_t n0) {
  __m512 acc[NB][MT];
  for (int j = 0; j < NB; j++)
    for (int m = 0; m < MT; m++) acc[j][m] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < K / 2; p++) {
    __m512 first[NB], second[NB];
    for (int j = 0; j < NB; j++) {
      const __m512i w = _mm512_loadu_si512(block + j * K * 16 + p * 32);
      first[j] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));  // a pair's first input is its low half
      second[j] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
    }
    for (int m = 0; m < MT; m++) {
      const __m512 x0 = _mm512_set1_ps(x[m * K + 2 * p]), x1 = _mm512_set1_ps(x[m * K + 2 * p + 1]);
      for (int j = 0; j < NB; j++) acc[j][m] = _mm512_fmadd_ps(second[j], x1, _mm512_fmadd_ps(first[j], x0, acc[j][m]));
    }
  }
  store_tile<NB, MT>(acc, y, N, n0);
}

}  // namespace
#pragma GCC pop_options

namespace {

// x rounded to bfloat16 (nearest even), two values per uint32 as vdpbf16ps reads them.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void round_to_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
  for (; i < n; i++) out[i] = bf16_bits(x[i]);  // the same rounding in integers
}

constexpr int64_t PANEL_BYTES = 256 << 10;  // of weights (each_panel_tile)

// WIDEN: bf16b_tile_widened on float32 x, else bf16b_tile on x's bf16 pairs.
template <bool WIDEN>
void bf16b_range(const uint32_t* xpairs, const float* x, int64_t M, int64_t K, const uint16_t* codes, float* y,
                 int64_t N, int64_t b_begin, int64_t b_end) {
  const int64_t panel = std::max<int64_t>(1, PANEL_BYTES / (K * 16 * 2 * 3)) * 3;
  each_panel_tile(M, b_begin, b_end, panel, [&](int64_t m0, auto rows, int64_t b, auto blocks) {
    constexpr int MT = decltype(rows)::value, NB = decltype(blocks)::value;
    if constexpr (WIDEN) bf16b_tile_widened<NB, MT>(x + m0 * K, K, codes + b * K * 16, y + m0 * N, N, b * 16);
    else bf16b_tile<NB, MT>(xpairs + m0 * (K / 2), K, codes + b * K * 16, y + m0 * N, N, b * 16);
  });
}

}  // namespace

void bf16b_matmul_avx512(const float* x, int64_t M, int64_t K, const uint16_t* codes, int64_t N, float* y,
                         bool dot_bf16) {
  std::vector<uint16_t> xb(dot_bf16 ? M * K : 0);
  if (dot_bf16) round_to_bf16(x, M * K, xb.data());
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(xb.data());
  at::parallel_for(0, (N + 15) / 16, 3, [&](int64_t b, int64_t e) {
    if (dot_bf16) bf16b_range<false>(pairs, x, M, K, codes, y, N, b, e);
    else bf16b_range<true>(pairs, x, M, K, codes, y, N, b, e);
  });
}

}  // namespace qs
