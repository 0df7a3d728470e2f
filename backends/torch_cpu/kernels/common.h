// Shared by the kernel sources: per-ISA target attributes and the int16 activation format.
//
// Every kernel is compiled for its own instruction set with a function attribute, so one library
// holds the AVX2 and AVX-512 variants and Python picks among them at run time (by the CPU's
// flags, minus any named in QWEN_SERVE_DISABLE_ISA). Nothing here runs unless chosen, so the
// library loads on any x86-64 CPU.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#define QS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define QS_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define QS_INLINE inline __attribute__((always_inline))

namespace qs {

constexpr int64_t GROUP = 64;

// The widest of the kernels' vector widths this CPU runs, for the kernels that choose it inside C++
// (fused.cpp's SiLU, delta_rule.cpp); the others are chosen in Python (native.py).
enum class Width { avx512, avx2, generic };

inline Width cpu_width() {
  static const Width width = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                                 ? Width::avx512
                             : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Width::avx2
                                                                                              : Width::generic;
  return width;
}

// Activations as int16 per group of 64 (relative error ~1e-5: the float result for all practical
// purposes), with each group's scale and exact float sum (for the zero points).
struct Activations {
  std::vector<int16_t> q;  // [M, K]; `split` orders each group's columns evens then odds
  std::vector<float> scale;  // [M, K / 64]
  std::vector<float> sum;  // [M, K / 64]
};

// Calls f(std::integral_constant<int, n>{}) with n clamped to 1..8: the kernels are templates on a
// small count (rows of x in a tile, vectors of a head's columns), one instance per count, picked here.
template <typename F>
QS_INLINE void with_count_1_to_8(int64_t n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// A tile's NB * MT accumulators (16 outputs each) into y (rows N apart), the outputs past N left out.
template <int NB, int MT>
__attribute__((target("avx512f"))) QS_INLINE void store_tile(__m512 (&acc)[NB][MT], float* y, int64_t N, int64_t n0) {
  for (int j = 0; j < NB; j++) {
    const int64_t left = N - n0 - 16 * j;
    const __mmask16 keep = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + m * N + n0 + 16 * j, keep, acc[j][m]);
  }
}

// Blocks [b_begin, b_end) in panels of `panel` blocks (whole groups of 3), every 8 rows of x run
// over a panel while it stays in L2 (so x is read once per panel), in tiles of up to 3 blocks:
// tile(m0, rows, b, blocks), rows and blocks as std::integral_constant.
template <typename Tile>
QS_INLINE void each_panel_tile(int64_t M, int64_t b_begin, int64_t b_end, int64_t panel, Tile&& tile) {
  for (int64_t p0 = b_begin; p0 < b_end; p0 += panel) {
    const int64_t p1 = p0 + panel < b_end ? p0 + panel : b_end;
    for (int64_t m0 = 0; m0 < M; m0 += 8)
      with_count_1_to_8(M - m0, [&](auto rows) {
        for (int64_t b = p0; b < p1; b += 3) {
          if (b + 2 < p1) tile(m0, rows, b, std::integral_constant<int, 3>{});
          else if (b + 1 < p1) tile(m0, rows, b, std::integral_constant<int, 2>{});
          else tile(m0, rows, b, std::integral_constant<int, 1>{});
        }
      });
  }
}

// float32 -> bfloat16 bits, rounded to nearest even as torch's .to(torch.bfloat16) and
// vcvtneps2bf16 do (a NaN stays a NaN).
inline uint16_t bf16_bits(float f) {
  if (f != f) return 0x7FC0;
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// The same rounding for 16 floats at once (finite values).
__attribute__((target("avx512f,avx512bw"))) QS_INLINE __m256i bf16_bits_avx512(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

// e^x for x <= 0 (softmax scores minus their maximum, SiLU's e^-|g|): 2^n * p(r) with
// |r| <= ln2 / 2, degree-6 Taylor polynomial, relative error ~2e-7.
__attribute__((target("avx512f,fma"))) QS_INLINE __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// The sum and the largest of 8 lanes (AVX-512 has these as intrinsics).
__attribute__((target("avx2"))) QS_INLINE float sum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

__attribute__((target("avx2"))) QS_INLINE float max_avx2(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// The same for 8 lanes on AVX2 CPUs (2^n built in the exponent bits: n >= -126 after the clamp).
__attribute__((target("avx2,fma"))) QS_INLINE __m256 exp_nonpositive_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i two_to_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
}

// One group of 64 activations as 4 vectors; returns its largest magnitude, its sum into *sum
// (what every int16 / int8 activation quantizer starts from).
QS_AVX512 inline float load_group_avx512(const float* xg, __m512 v[4], float* sum) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 amax = _mm512_setzero_ps(), total = _mm512_setzero_ps();
  for (int j = 0; j < 4; j++) {
    v[j] = _mm512_loadu_ps(xg + 16 * j);
    amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, v[j]));
    total = _mm512_add_ps(total, v[j]);
  }
  *sum = _mm512_reduce_add_ps(total);
  return _mm512_reduce_max_ps(amax);
}

Activations quantize_activations_avx512(const float* x, int64_t M, int64_t K);

}  // namespace qs
