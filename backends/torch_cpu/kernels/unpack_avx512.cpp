// Blocked int4 and bfloat16 weights unpacked into a prefill tile (AVX-512), float32 or bfloat16.
//
// The tile is written transposed, [K, 16 * blocks]: in the blocked layout one 32-byte chunk holds
// the same 4 inputs of a block's 16 rows, so each of those inputs becomes one 16-float store of
// the 16 rows side by side, with the rows' scales and zeros loaded once per group. GEMM reads the
// transposed tile as its B operand at no extra cost (x @ tile instead of x @ tile.T). The pure-torch
// unpack this replaces ran at ~0.5 G weights/s on a Sapphire Rapids, so a 72-row int4 prefill
// spent most of its time unpacking; on an Ice Lake (2 threads) this writes 1.6 G weights/s as
// float32 (bound by writing 4 bytes a weight past the caches) and 10 G weights/s as bfloat16,
// against 0.23 for the torch unpack there.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "common.h"
#include "kernels.h"

namespace qs {

namespace {

// Group g of blocks [first, stop): output rows 64g .. 64g + 63, each filled 16 columns per block,
// so a thread's stores go to 64 rows at a time, each written front to back. The caller keeps ld off
// powers of two: at ld 4096 those 64 rows shared cache sets and bf16 ran 3x slower.
template <bool BF16>
QS_AVX512 void unpack_group(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero, int64_t groups,
                            int64_t g, int64_t first, int64_t stop, void* out, int64_t ld) {
  const __m512i nibble = _mm512_set1_epi32(0xF);
  for (int64_t i = first; i < stop; i++) {
    const int64_t at = (i * groups + g) * 16, column = (i - first) * 16;
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale + at)));
    const __m512 z = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(zero + at)));
    const uint8_t* chunks = codes + at * 32;
    for (int64_t c = 0; c < 16; c++) {
      // 16 rows' two bytes: byte 0 holds inputs 4c and 4c + 2, byte 1 inputs 4c + 1 and 4c + 3
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunks + c * 32)));
      const __m512i q[4] = {_mm512_and_si512(w, nibble), _mm512_and_si512(_mm512_srli_epi32(w, 8), nibble),
                            _mm512_and_si512(_mm512_srli_epi32(w, 4), nibble), _mm512_srli_epi32(w, 12)};
      for (int j = 0; j < 4; j++) {
        const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q[j]), s, z);
        const int64_t k = g * 64 + 4 * c + j;
        if constexpr (BF16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + k * ld + column), bf16_bits_avx512(v));
        else
          _mm512_storeu_ps(static_cast<float*>(out) + k * ld + column, v);
      }
    }
  }
}

// Pairs [p_begin, p_end) of blocks [first, stop) of a blocked bf16 weight ([blocks, K/2, 16 rows, 2]):
// one 64-byte load holds inputs 2p and 2p + 1 of a block's 16 rows interleaved; a word permute puts
// input 2p's 16 rows in the low half and 2p + 1's in the high, each half one store (bf16) or, shifted
// to the float32 bit position, two.
template <bool BF16>
QS_AVX512 void unpack_pairs(const uint16_t* codes, int64_t half_k, int64_t p_begin, int64_t p_end, int64_t first,
                            int64_t stop, void* out, int64_t ld) {
  alignas(64) int16_t order[32];
  for (int i = 0; i < 16; i++) order[i] = static_cast<int16_t>(2 * i), order[16 + i] = static_cast<int16_t>(2 * i + 1);
  const __m512i split = _mm512_load_si512(order);
  for (int64_t p = p_begin; p < p_end; p++) {
    for (int64_t i = first; i < stop; i++) {
      const __m512i w = _mm512_permutexvar_epi16(split, _mm512_loadu_si512(codes + (i * half_k + p) * 32));
      const int64_t column = (i - first) * 16;
      for (int half = 0; half < 2; half++) {
        const __m256i bits = half ? _mm512_extracti64x4_epi64(w, 1) : _mm512_castsi512_si256(w);
        const int64_t k = 2 * p + half;
        if constexpr (BF16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + k * ld + column), bits);
        else
          _mm512_storeu_si512(static_cast<float*>(out) + k * ld + column,
                              _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
      }
    }
  }
}

}  // namespace

void bf16b_unpack_avx512(const uint16_t* codes, int64_t K, int64_t first, int64_t stop, void* out, int64_t ld,
                         bool bf16) {
  at::parallel_for(0, K / 2, 16, [&](int64_t b, int64_t e) {
    if (bf16)
      unpack_pairs<true>(codes, K / 2, b, e, first, stop, out, ld);
    else
      unpack_pairs<false>(codes, K / 2, b, e, first, stop, out, ld);
  });
}

void q4b_unpack_avx512(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero, int64_t groups,
                       int64_t first, int64_t stop, void* out, int64_t ld, bool bf16) {
  at::parallel_for(0, groups, 1, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; g++) {
      if (bf16)
        unpack_group<true>(codes, scale, zero, groups, g, first, stop, out, ld);
      else
        unpack_group<false>(codes, scale, zero, groups, g, first, stop, out, ld);
    }
  });
}

}  // namespace qs
