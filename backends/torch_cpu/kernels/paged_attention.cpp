// Decode attention that reads the paged KV cache where it lies: each part of a sequence (256
// tokens) walks its stretch of the block table, so no step gathers a sequence's history into a
// new tensor, and a long sequence's parts run on every thread. float32 or bfloat16 caches;
// scores, softmax and the output in float32. One algorithm (paged_attention_body.inc) over
// 16-lane AVX-512 and 8-lane AVX2 vectors.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace paged_avx512 {

using V = __m512;
constexpr int64_t LANES = 16;
constexpr int64_t COLUMN_VECTORS = 8;  // 2 heads x 8 accumulators + 8 values of 32 registers
constexpr int SCORE_HEADS = 4, SCORE_PAIRED = 4;  // 16 accumulators + 4 keys + a query of 32

QS_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
QS_INLINE V load(const uint16_t* p) {  // bfloat16 -> float32 is a 16-bit shift
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
QS_INLINE __mmask16 first_lanes(int64_t n) { return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }
QS_INLINE V load_first(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first_lanes(n), p); }
QS_INLINE void store_first(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, first_lanes(n), v); }
QS_INLINE V keep_first(V v, int64_t n) { return _mm512_maskz_mov_ps(first_lanes(n), v); }
QS_INLINE void store(float* p, V v) { _mm512_storeu_ps(p, v); }
QS_INLINE V zero() { return _mm512_setzero_ps(); }
QS_INLINE V set1(float x) { return _mm512_set1_ps(x); }
QS_INLINE V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
QS_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
QS_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
QS_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
QS_INLINE V max(V a, V b) { return _mm512_max_ps(a, b); }
QS_INLINE float sum_of(V v) { return _mm512_reduce_add_ps(v); }
QS_INLINE float max_of(V v) { return _mm512_reduce_max_ps(v); }
QS_INLINE V exp_of_nonpositive(V x) { return exp_nonpositive(x); }

#include "paged_attention_body.inc"

}  // namespace paged_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace paged_avx2 {

using V = __m256;
constexpr int64_t LANES = 8;
constexpr int64_t COLUMN_VECTORS = 4;  // 2 heads x 4 accumulators + 4 values of 16 registers
constexpr int SCORE_HEADS = 4, SCORE_PAIRED = 2;  // 8 accumulators + 2 keys + a query of 16

QS_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
QS_INLINE V load(const uint16_t* p) {  // bfloat16 -> float32 is a 16-bit shift
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
QS_INLINE __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
QS_INLINE V load_first(const float* p, int64_t n) { return _mm256_maskload_ps(p, first_lanes(n)); }
QS_INLINE void store_first(float* p, V v, int64_t n) { _mm256_maskstore_ps(p, first_lanes(n), v); }
QS_INLINE V keep_first(V v, int64_t n) { return _mm256_and_ps(v, _mm256_castsi256_ps(first_lanes(n))); }
QS_INLINE void store(float* p, V v) { _mm256_storeu_ps(p, v); }
QS_INLINE V zero() { return _mm256_setzero_ps(); }
QS_INLINE V set1(float x) { return _mm256_set1_ps(x); }
QS_INLINE V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
QS_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
QS_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
QS_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
QS_INLINE V max(V a, V b) { return _mm256_max_ps(a, b); }
QS_INLINE float sum_of(V v) { return sum_avx2(v); }
QS_INLINE float max_of(V v) { return max_avx2(v); }
QS_INLINE V exp_of_nonpositive(V x) { return exp_nonpositive_avx2(x); }

#include "paged_attention_body.inc"

}  // namespace paged_avx2
#pragma GCC pop_options

void paged_decode_avx512(const float* q, int64_t q_stride, int64_t B, int64_t H, int64_t D, const void* key_cache,
                         const void* value_cache, bool kv_bf16, int64_t Hkv, const int64_t* block_tables,
                         int64_t max_blocks, const int64_t* lengths, int64_t block_size, float scale, float* out) {
  paged_avx512::paged_decode(q, q_stride, B, H, D, key_cache, value_cache, kv_bf16, Hkv, block_tables, max_blocks,
                             lengths, block_size, scale, out);
}

void paged_decode_avx2(const float* q, int64_t q_stride, int64_t B, int64_t H, int64_t D, const void* key_cache,
                       const void* value_cache, bool kv_bf16, int64_t Hkv, const int64_t* block_tables,
                       int64_t max_blocks, const int64_t* lengths, int64_t block_size, float scale, float* out) {
  paged_avx2::paged_decode(q, q_stride, B, H, D, key_cache, value_cache, kv_bf16, Hkv, block_tables, max_blocks,
                           lengths, block_size, scale, out);
}

}  // namespace qs
