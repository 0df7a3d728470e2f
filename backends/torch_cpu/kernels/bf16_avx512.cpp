// bfloat16 weights times float32 x with float32 results (AVX512-BF16): for the lm_head, whose
// logits must stay float32 (rounded to bf16, the top two logits of SmolLM2 tied), and which is
// the largest matrix a bf16 model reads per token. Weight layout [blocks, K/2, 16 rows, 2].
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <vector>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
namespace {

template <int MT>
void bf16b_tile(const uint32_t* xpairs, int64_t K, const uint16_t* block, float* y, int64_t N, int64_t n0) {
  __m512 acc[MT];
  for (int m = 0; m < MT; m++) acc[m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < K / 2; p++) {
    const __m512bh w = (__m512bh)_mm512_loadu_si512(block + p * 32);
    for (int m = 0; m < MT; m++)
      acc[m] = _mm512_dpbf16_ps(acc[m], w, (__m512bh)_mm512_set1_epi32(xpairs[m * (K / 2) + p]));
  }
  const __mmask16 keep = N - n0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (N - n0)) - 1);
  for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + m * N + n0, keep, acc[m]);
}

void bf16b_range(const uint32_t* xpairs, int64_t M, int64_t K, const uint16_t* codes, float* y, int64_t N,
                 int64_t b_begin, int64_t b_end) {
  for (int64_t b = b_begin; b < b_end; b++) {
    const uint16_t* block = codes + b * K * 16;
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
      const uint32_t* xm = xpairs + m0 * (K / 2);
      float* ym = y + m0 * N;
      with_count_1_to_8(M - m0, [&](auto rows) { bf16b_tile<decltype(rows)::value>(xm, K, block, ym, N, b * 16); });
    }
  }
}

// x rounded to bfloat16 (nearest even), two values per uint32 as vdpbf16ps reads them.
void round_to_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
  for (; i < n; i++) {  // the same rounding in integers (x is finite)
    uint32_t bits;
    __builtin_memcpy(&bits, x + i, 4);
    out[i] = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
}

}  // namespace
#pragma GCC pop_options

void bf16b_matmul_avx512(const float* x, int64_t M, int64_t K, const uint16_t* codes, int64_t N, float* y) {
  std::vector<uint16_t> xb(M * K);
  round_to_bf16(x, M * K, xb.data());
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(xb.data());
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t b, int64_t e) { bf16b_range(pairs, M, K, codes, y, N, b, e); });
}

}  // namespace qs
