// AVX2 int4 / int8 matmuls on the canonical layout (CPUs without AVX-512, e.g. Zen 3).
//
// At decode (a few rows of x) a linear layer is bound by memory bandwidth, so these read the
// packed weights as they are: each 64-weight group is unpacked into registers once and used by
// up to 8 rows of x, so batch-8 decode pays the unpacking once, not eight times.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>

#include "common.h"
#include "kernels.h"

namespace qs {
namespace {

constexpr int64_t HALF = 32;

QS_AVX2 QS_INLINE float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

// Sum of the 64 products of one group: four vectors of 16 int16 weights by the group's codes.
QS_AVX2 QS_INLINE __m256i dot_group(const __m256i w[4], const int16_t* xg) {
  const __m256i* xv = reinterpret_cast<const __m256i*>(xg);
  return _mm256_add_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_loadu_si256(xv)), _mm256_madd_epi16(w[1], _mm256_loadu_si256(xv + 1))),
      _mm256_add_epi32(_mm256_madd_epi16(w[2], _mm256_loadu_si256(xv + 2)), _mm256_madd_epi16(w[3], _mm256_loadu_si256(xv + 3))));
}

QS_AVX2 QS_INLINE void widen_u8(__m256i bytes, __m256i out[2]) {
  out[0] = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(bytes));
  out[1] = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(bytes, 1));
}

QS_AVX2 void q4_rows(const Activations& a, int64_t M, int64_t K, const uint8_t* packed, const uint16_t* scale,
                     const uint16_t* zero, int64_t N, float* y, int64_t n_begin, int64_t n_end) {
  const int64_t groups = K / GROUP;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t n = n_begin; n < n_end; n++) {
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
      const int rows = M - m0 < 8 ? static_cast<int>(M - m0) : 8;
      __m256 acc[8];
      float offset[8];
      for (int m = 0; m < rows; m++) { acc[m] = _mm256_setzero_ps(); offset[m] = 0.f; }
      for (int64_t g = 0; g < groups; g++) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + n * (K / 2) + g * HALF));
        __m256i codes[4];
        widen_u8(_mm256_and_si256(b, low4), codes);
        widen_u8(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4), codes + 2);
        const float s = _cvtsh_ss(scale[n * groups + g]), z = _cvtsh_ss(zero[n * groups + g]);
        for (int m = 0; m < rows; m++) {
          const int64_t i = (m0 + m) * groups + g;
          const __m256i p = dot_group(codes, a.q.data() + i * GROUP);
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s * a.scale[i]), acc[m]);
          offset[m] += z * a.sum[i];
        }
      }
      for (int m = 0; m < rows; m++) y[(m0 + m) * N + n] = hsum(acc[m]) + offset[m];
    }
  }
}

QS_AVX2 void q8_rows(const Activations& a, int64_t M, int64_t K, const int8_t* w, const float* scale, int64_t N,
                     float* y, int64_t n_begin, int64_t n_end) {
  const int64_t groups = K / GROUP;
  for (int64_t n = n_begin; n < n_end; n++) {
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
      const int rows = M - m0 < 8 ? static_cast<int>(M - m0) : 8;
      __m256 acc[8];
      for (int m = 0; m < rows; m++) acc[m] = _mm256_setzero_ps();
      for (int64_t g = 0; g < groups; g++) {
        const __m128i* wv = reinterpret_cast<const __m128i*>(w + n * K + g * GROUP);
        __m256i codes[4];
        for (int i = 0; i < 4; i++) codes[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(wv + i));
        for (int m = 0; m < rows; m++) {
          const int64_t i = (m0 + m) * groups + g;
          const __m256i p = dot_group(codes, a.q.data() + i * GROUP);
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(a.scale[i]), acc[m]);
        }
      }
      for (int m = 0; m < rows; m++) y[(m0 + m) * N + n] = hsum(acc[m]) * scale[n];
    }
  }
}

QS_AVX2 void dequant_split_rows(const uint8_t* packed, const uint16_t* scale, const uint16_t* zero, int64_t K,
                                float* out, int64_t n_begin, int64_t n_end) {
  const int64_t groups = K / GROUP;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t n = n_begin; n < n_end; n++)
    for (int64_t g = 0; g < groups; g++) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + n * (K / 2) + g * HALF));
      const __m256i halves[2] = {_mm256_and_si256(b, low4), _mm256_and_si256(_mm256_srli_epi16(b, 4), low4)};
      const __m256 s = _mm256_set1_ps(_cvtsh_ss(scale[n * groups + g]));
      const __m256 z = _mm256_set1_ps(_cvtsh_ss(zero[n * groups + g]));
      float* dst = out + n * K + g * GROUP;
      for (int h = 0; h < 2; h++) {
        const __m128i parts[2] = {_mm256_castsi256_si128(halves[h]), _mm256_extracti128_si256(halves[h], 1)};
        for (int p = 0; p < 2; p++) {
          const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
          const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(parts[p], 8)));
          _mm256_storeu_ps(dst + h * HALF + p * 16, _mm256_fmadd_ps(lo, s, z));
          _mm256_storeu_ps(dst + h * HALF + p * 16 + 8, _mm256_fmadd_ps(hi, s, z));
        }
      }
    }
}

}  // namespace

Activations quantize_activations_avx2(const float* x, int64_t M, int64_t K, bool split) {
  const int64_t groups = K / GROUP;
  Activations a{std::vector<int16_t>(M * K), std::vector<float>(M * groups), std::vector<float>(M * groups)};
  for (int64_t i = 0; i < M * groups; i++) {
    const float* xg = x + i * GROUP;
    float amax = 0.f, sum = 0.f;
    for (int j = 0; j < GROUP; j++) { amax = std::fmax(amax, std::fabs(xg[j])); sum += xg[j]; }
    const float inv = amax > 0.f ? 32767.f / amax : 0.f;
    int16_t* qg = a.q.data() + i * GROUP;
    for (int j = 0; j < GROUP; j++)
      qg[split ? (j & 1) * HALF + (j >> 1) : j] = static_cast<int16_t>(std::lrint(xg[j] * inv));
    a.scale[i] = amax / 32767.f;
    a.sum[i] = sum;
  }
  return a;
}

void q4_matmul_avx2(const float* x, int64_t M, int64_t K, const uint8_t* packed, const uint16_t* scale,
                    const uint16_t* zero, int64_t N, float* y) {
  const Activations a = quantize_activations_avx2(x, M, K, true);
  at::parallel_for(0, N, 16, [&](int64_t b, int64_t e) { q4_rows(a, M, K, packed, scale, zero, N, y, b, e); });
}

void q8_matmul_avx2(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scale, int64_t N, float* y) {
  const Activations a = quantize_activations_avx2(x, M, K, false);
  at::parallel_for(0, N, 16, [&](int64_t b, int64_t e) { q8_rows(a, M, K, w, scale, N, y, b, e); });
}

void q4_dequant_split_avx2(const uint8_t* packed, const uint16_t* scale, const uint16_t* zero, int64_t N, int64_t K,
                           float* out) {
  at::parallel_for(0, N, 16, [&](int64_t b, int64_t e) { dequant_split_rows(packed, scale, zero, K, out, b, e); });
}

void permute_groups(const float* x, int64_t M, int64_t K, float* xp) {
  for (int64_t i = 0; i < M * K; i += GROUP)
    for (int64_t j = 0; j < HALF; j++) {
      xp[i + j] = x[i + 2 * j];
      xp[i + HALF + j] = x[i + 2 * j + 1];
    }
}

}  // namespace qs
