// AVX-512 int4 / int8 matmuls on the blocked layouts: with VNNI the int8-activation kernels of
// vnni8_avx512.cpp, without it int16 activations and vpmaddwd (int4_avx512_body.inc), with the
// vectorized int16 quantization of the activations.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
namespace plain {
#define QS_DP(acc, w, x) _mm512_add_epi32(acc, _mm512_madd_epi16(w, x))
#include "int4_avx512_body.inc"
#undef QS_DP
}  // namespace plain

namespace {
void quantize_rows(const float* x, int64_t K, Activations& a, int64_t i_begin, int64_t i_end) {
  for (int64_t i = i_begin; i < i_end; i++) {  // i: one group of one row
    __m512 v[4];
    const float top = load_group_avx512(x + i * GROUP, v, &a.sum[i]);
    const __m512 inv = _mm512_set1_ps(top > 0.f ? 32767.f / top : 0.f);
    for (int j = 0; j < 4; j++)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q.data() + i * GROUP + 16 * j),
                          _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v[j], inv))));
    a.scale[i] = top / 32767.f;
  }
}
}  // namespace
#pragma GCC pop_options

Activations quantize_activations_avx512(const float* x, int64_t M, int64_t K) {
  const int64_t groups = K / GROUP;
  Activations a{std::vector<int16_t>(M * K), std::vector<float>(M * groups), std::vector<float>(M * groups)};
  quantize_rows(x, K, a, 0, M * groups);
  return a;
}

void q4b_matmul_avx512(const float* x, int64_t M, int64_t K, const uint8_t* codes, const uint16_t* scale,
                       const uint16_t* zero, int64_t N, float* y, bool use_vnni) {
  if (use_vnni) return q4b_matmul_vnni8(x, M, K, codes, scale, zero, N, y);
  const Activations a = quantize_activations_avx512(x, M, K);
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t b, int64_t e) {
    plain::q4b_range(a, M, K, codes, scale, zero, y, N, b, e);
  });
}

void q8b_matmul_avx512(const float* x, int64_t M, int64_t K, const int8_t* codes, const float* scale, int64_t N,
                       float* y, bool use_vnni) {
  if (use_vnni) return q8b_matmul_vnni8(x, M, K, codes, scale, N, y);
  const Activations a = quantize_activations_avx512(x, M, K);
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t b, int64_t e) {
    plain::q8b_range(a, M, K, codes, scale, y, N, b, e);
  });
}

}  // namespace qs
