// AVX2 int4 / int8 matmuls on the canonical layout (CPUs without AVX-512, e.g. Zen 3).
//
// At decode (a few rows of x) a linear layer should be bound by memory bandwidth, so these read
// the packed weights as they are: each 64-weight group is unpacked into registers once and used
// by up to 8 rows of x, so batch-8 decode pays the unpacking once, not eight times.
//
// Both take their activations as int8 per group of 64 (as llama.cpp's Q4_0 x Q8_0 and the AVX-512
// VNNI kernels do): vpmaddubsw multiplies unsigned codes by them 32 pairs at a time, half the
// instructions of int16 activations. The earlier int16 kernel, its accumulators indexed
// by a run-time row count (so kept on the stack), read 10.6 GB/s of codes at one row on two Zen 3
// cores: compute-bound far below the ~30 GB/s the memory gives.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {

constexpr int64_t HALF = 32;

// int8 activations per group of 64, with the group's scale and exact sum: for the int4 kernel
// (SPLIT) each group's 32 even inputs, then its 32 odd ones (the low and high nibbles of the
// canonical layout's bytes); for int8 weights in order.
//
// The codes c are 0..15 (w = s c + z), so the rounding of x would meet codes of mean 7.5, an error
// that does not cancel (2-5% on random rows). The kernel therefore sums s (c - 8) xq + (z + 8 s) x,
// as centred codes would, from the unsigned products: s (sum c xq - 8 sum xq) + z sum x + 8 s sum x
// = s sum c xq + z sum x + s * 8 (sum x - sum xq): the last factor is `centring` below.
struct Activations8 {
  std::vector<int8_t> q;  // [M, K]
  std::vector<float> scale;  // [M, K / 64]
  std::vector<float> sum;  // [M, K / 64]: sum x, exact (SPLIT only)
  std::vector<float> centring;  // [M, K / 64]: 8 (sum x - scale * sum q) (SPLIT only)
};

// 32 int32 values (four vectors, in order) as 32 saturated int8 in order.
QS_AVX2 QS_INLINE __m256i pack_bytes(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // undo the per-lane packing
}

template <bool SPLIT>
QS_AVX2 Activations8 quantize8(const float* x, int64_t M, int64_t K) {
  const int64_t groups = M * K / GROUP;
  Activations8 a{std::vector<int8_t>(M * K), std::vector<float>(groups), std::vector<float>(SPLIT ? groups : 0),
                 std::vector<float>(SPLIT ? groups : 0)};  // int8 weights have no zero points: no sums
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < groups; i++) {
    const float* xg = x + i * GROUP;
    __m256 halves[2][4], amax = _mm256_setzero_ps(), total = _mm256_setzero_ps();  // the group's stored halves
    for (int j = 0; j < 4; j++) {  // inputs 16j .. 16j + 15
      const __m256 lo = _mm256_loadu_ps(xg + 16 * j), hi = _mm256_loadu_ps(xg + 16 * j + 8);
      amax = _mm256_max_ps(amax, _mm256_max_ps(_mm256_andnot_ps(sign, lo), _mm256_andnot_ps(sign, hi)));
      if (SPLIT) {  // evens, then odds
        total = _mm256_add_ps(total, _mm256_add_ps(lo, hi));
        // shuffle_ps takes 0 2 (1 3) of each 4 from lo then hi, per 128-bit lane; the permute puts
        // the lanes' halves in input order
        halves[0][j] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
        halves[1][j] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
      } else {  // in order: the first 32 inputs, then the last
        halves[j / 2][2 * (j % 2)] = lo, halves[j / 2][2 * (j % 2) + 1] = hi;
      }
    }
    const float top = max_avx2(amax);
    const __m256 inv = _mm256_set1_ps(top > 0.f ? 127.f / top : 0.f);
    __m256i qsum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      __m256i q[4];
      for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(halves[h][j], inv)), qsum = _mm256_add_epi32(qsum, q[j]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q.data() + i * GROUP + h * HALF), pack_bytes(q[0], q[1], q[2], q[3]));
    }
    a.scale[i] = top / 127.f;
    if (SPLIT) {
      const float qtotal = sum_avx2(_mm256_cvtepi32_ps(qsum));  // exact: |sum q| <= 64 * 127
      a.sum[i] = sum_avx2(total);
      a.centring[i] = static_cast<float>(8.0 * (static_cast<double>(a.sum[i]) - static_cast<double>(a.scale[i]) * qtotal));
    }
  }
  return a;
}

// The codes are prefetched this many bytes ahead of their reads. A thread streams its output rows
// one after another, so this runs straight into the next row: measured on two Zen 3 cores at one
// row of x, 24 -> 30 GB/s from memory with one stream and this distance, against four rows' streams
// interleaved with the next tile prefetched (the hardware prefetchers alone: 20-26 GB/s).
constexpr int64_t PREFETCH_BYTES = 2048;

// Ahead of a few rows' tile: the output row's group scales times each row of x's (`scales`,
// [MT][groups]) and the zero points' and centring's terms of each output (`offset`), eight groups a
// vector. Inside the codes' loop, the half-precision conversions and scalar products of every group
// cost about as much as the dot itself.
template <int MT>
QS_AVX2 QS_INLINE void few_rows_scales(const Activations8& a, int64_t m0, int64_t groups, const uint16_t* s_row,
                                       const uint16_t* z_row, float* scales, float offset[MT]) {
  for (int m = 0; m < MT; m++) {
    const int64_t row = (m0 + m) * groups;
    const float *x_scale = a.scale.data() + row, *x_sum = a.sum.data() + row, *x_centring = a.centring.data() + row;
    float* out = scales + m * groups;
    __m256 terms = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s_row + g)));
      const __m256 z = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(z_row + g)));
      _mm256_storeu_ps(out + g, _mm256_mul_ps(s, _mm256_loadu_ps(x_scale + g)));
      terms = _mm256_fmadd_ps(z, _mm256_loadu_ps(x_sum + g), _mm256_fmadd_ps(s, _mm256_loadu_ps(x_centring + g), terms));
    }
    float total = sum_avx2(terms);
    for (; g < groups; g++) {
      const float s = _cvtsh_ss(s_row[g]);
      out[g] = s * x_scale[g];
      total += _cvtsh_ss(z_row[g]) * x_sum[g] + s * x_centring[g];
    }
    offset[m] = total;
  }
}

// Output row n times MT rows of x: MT accumulator chains in registers (with the row's codes; the
// activations are read from memory by vpmaddubsw). Codes are 0..15 and activations within +-127,
// so a pair's sum (<= 3,810) and two pairs' (<= 7,620) fit vpmaddubsw's and vpaddw's int16 without
// saturating. OFFSETS (a few rows of x): the scales' products and the offsets come from
// few_rows_scales, through `scales`; otherwise y already holds the offsets (q4_offsets) and the
// tile adds to it.
template <int MT, bool OFFSETS>
QS_AVX2 QS_INLINE void q4_tile(const Activations8& a, int64_t m0, int64_t K, const uint8_t* packed,
                               const uint16_t* scale, const uint16_t* zero, float* y, int64_t N, int64_t n,
                               float* scales) {
  const int64_t groups = K / GROUP;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[MT];
  float offset[MT];
  if (OFFSETS) few_rows_scales<MT>(a, m0, groups, scale + n * groups, zero + n * groups, scales, offset);
  for (int m = 0; m < MT; m++) acc[m] = _mm256_setzero_ps();
  const uint8_t* row = packed + n * (K / 2);
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* codes = row + g * HALF;
    _mm_prefetch(reinterpret_cast<const char*>(codes + PREFETCH_BYTES), _MM_HINT_T0);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
    const __m256i lo = _mm256_and_si256(b, low4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
    const __m256 s = OFFSETS ? _mm256_setzero_ps() : _mm256_set1_ps(_cvtsh_ss(scale[n * groups + g]));
    for (int m = 0; m < MT; m++) {
      const int64_t i = (m0 + m) * groups + g;
      const __m256i* xg = reinterpret_cast<const __m256i*>(a.q.data() + i * GROUP);
      const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(xg)),
                                             _mm256_maddubs_epi16(hi, _mm256_loadu_si256(xg + 1)));
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
      if (OFFSETS)  // a load that broadcasts: no shuffle, no conversion
        acc[m] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(scales + m * groups + g), acc[m]);
      else  // the row's scale broadcast by a load, no shuffle
        acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(dot, _mm256_broadcast_ss(a.scale.data() + i)), s, acc[m]);
    }
  }
  for (int m = 0; m < MT; m++) {
    float& out = y[(m0 + m) * N + n];
    out = OFFSETS ? sum_avx2(acc[m]) + offset[m] : out + sum_avx2(acc[m]);
  }
}

// Rows of x past which the offsets are one float32 GEMM before the tiles (q4_offsets), and the
// output rows are taken in panels that stay in cache while every 8 rows of x pass over them.
constexpr int64_t FEW_ROWS = 16;
constexpr int64_t PANEL_ROWS = 64;

// Output rows [n_begin, n_end), one after another: at a few rows of x, each output row by all of
// them; past that, panels of output rows by 8 rows of x at a time.
QS_AVX2 void q4_rows(const Activations8& a, int64_t M, int64_t K, const uint8_t* packed, const uint16_t* scale,
                     const uint16_t* zero, int64_t N, float* y, int64_t n_begin, int64_t n_end) {
  if (M <= FEW_ROWS) {
    std::vector<float> scales(8 * (K / GROUP));  // a tile's products, up to 8 rows of x
    for (int64_t n = n_begin; n < n_end; n++)
      for (int64_t m0 = 0; m0 < M; m0 += 8)
        with_count_1_to_8(M - m0, [&](auto rows) {
          q4_tile<decltype(rows)::value, true>(a, m0, K, packed, scale, zero, y, N, n, scales.data());
        });
    return;
  }
  for (int64_t p0 = n_begin; p0 < n_end; p0 += PANEL_ROWS) {
    const int64_t p1 = p0 + PANEL_ROWS < n_end ? p0 + PANEL_ROWS : n_end;
    for (int64_t m0 = 0; m0 < M; m0 += 8)
      with_count_1_to_8(M - m0, [&](auto rows) {
        for (int64_t r = p0; r < p1; r++)
          q4_tile<decltype(rows)::value, false>(a, m0, K, packed, scale, zero, y, N, r, nullptr);
      });
  }
}

// y [M, N] = the zero points' and centring's terms of every output: sum over groups g of
// z[n, g] sum[m, g] + s[n, g] centring[m, g], one float32 GEMM ([M, 2G] by [2G, N]).
QS_AVX2 void q4_offsets(const Activations8& a, int64_t M, int64_t K, const uint16_t* scale, const uint16_t* zero, int64_t N,
                float* y) {
  const int64_t groups = K / GROUP;
  at::Tensor lhs = at::empty({M, 2 * groups}, at::kFloat), rhs = at::empty({2 * groups, N}, at::kFloat);
  float *l = lhs.data_ptr<float>(), *r = rhs.data_ptr<float>();
  for (int64_t m = 0; m < M; m++)
    for (int64_t g = 0; g < groups; g++) l[m * 2 * groups + g] = a.sum[m * groups + g],
                                          l[m * 2 * groups + groups + g] = a.centring[m * groups + g];
  at::parallel_for(0, N, 256, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; n++)
      for (int64_t g = 0; g < groups; g++) r[g * N + n] = _cvtsh_ss(zero[n * groups + g]),
                                            r[(groups + g) * N + n] = _cvtsh_ss(scale[n * groups + g]);
  });
  at::Tensor out = at::from_blob(y, {M, N}, at::kFloat);
  at::mm_out(out, lhs, rhs);
}

// Output row n of int8 weights times MT rows of x, int8 by int8 as vpmaddubsw takes them: unsigned
// |w| by x with w's sign (|w| <= 128, |x| <= 127: a pair's sum fits int16). The int16 activations
// this replaced widened every code and read twice the activations' bytes: 10.5 GB/s from one Zen 3
// core for a 248,320 x 1024 head.
template <int MT>
QS_AVX2 QS_INLINE void q8_tile(const Activations8& a, int64_t m0, int64_t K, const int8_t* w, const float* scale,
                               float* y, int64_t N, int64_t n) {
  const int64_t groups = K / GROUP;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MT];
  for (int m = 0; m < MT; m++) acc[m] = _mm256_setzero_ps();
  const int8_t* row = w + n * K;
  for (int64_t g = 0; g < groups; g++) {
    const __m256i* codes = reinterpret_cast<const __m256i*>(row + g * GROUP);
    _mm_prefetch(reinterpret_cast<const char*>(codes) + PREFETCH_BYTES, _MM_HINT_T0);
    const __m256i w0 = _mm256_loadu_si256(codes), w1 = _mm256_loadu_si256(codes + 1);
    const __m256i u0 = _mm256_sign_epi8(w0, w0), u1 = _mm256_sign_epi8(w1, w1);
    for (int m = 0; m < MT; m++) {
      const int64_t i = (m0 + m) * groups + g;
      const __m256i* xg = reinterpret_cast<const __m256i*>(a.q.data() + i * GROUP);
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(_mm256_loadu_si256(xg), w0)), ones);
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(_mm256_loadu_si256(xg + 1), w1)), ones);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), _mm256_broadcast_ss(a.scale.data() + i), acc[m]);
    }
  }
  for (int m = 0; m < MT; m++) y[(m0 + m) * N + n] = sum_avx2(acc[m]) * scale[n];
}

QS_AVX2 void q8_rows(const Activations8& a, int64_t M, int64_t K, const int8_t* w, const float* scale, int64_t N,
                     float* y, int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; n++)
    for (int64_t m0 = 0; m0 < M; m0 += 8)
      with_count_1_to_8(M - m0, [&](auto rows) { q8_tile<decltype(rows)::value>(a, m0, K, w, scale, y, N, n); });
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
#pragma GCC pop_options

void q4_matmul_avx2(const float* x, int64_t M, int64_t K, const uint8_t* packed, const uint16_t* scale,
                    const uint16_t* zero, int64_t N, float* y) {
  const Activations8 a = quantize8<true>(x, M, K);
  if (M > FEW_ROWS) q4_offsets(a, M, K, scale, zero, N, y);
  at::parallel_for(0, N, 16, [&](int64_t b, int64_t e) { q4_rows(a, M, K, packed, scale, zero, N, y, b, e); });
}

void q8_matmul_avx2(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scale, int64_t N, float* y) {
  const Activations8 a = quantize8<false>(x, M, K);
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
