// Decode attention that reads the paged KV cache where it lies: each (sequence, kv head) walks
// its block table, so no step gathers a sequence's history into a new tensor. float32 or
// bfloat16 caches; scores, softmax and the output in float32.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace {

QS_INLINE __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

QS_INLINE __m512 load16(const uint16_t* p) {  // bfloat16 -> float32 is a 16-bit shift
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// Softmax of one head's scores in place (len values; the last partial vector is masked).
void softmax_in_place(float* s, int64_t len) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 16 <= len; t += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + t));
  float m = _mm512_reduce_max_ps(top);
  for (; t < len; t++) m = s[t] > m ? s[t] : m;
  __m512 total = _mm512_setzero_ps();
  const __mmask16 all = 0xFFFF;
  for (t = 0; t < len; t += 16) {
    const __mmask16 keep = len - t >= 16 ? all : static_cast<__mmask16>((1u << (len - t)) - 1);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(keep, s + t), _mm512_set1_ps(m)));
    const __m512 kept = _mm512_maskz_mov_ps(keep, e);
    _mm512_mask_storeu_ps(s + t, keep, kept);
    total = _mm512_add_ps(total, kept);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
  for (t = 0; t < len; t += 16) {
    const __mmask16 keep = len - t >= 16 ? all : static_cast<__mmask16>((1u << (len - t)) - 1);
    _mm512_mask_storeu_ps(s + t, keep, _mm512_mul_ps(_mm512_maskz_loadu_ps(keep, s + t), inv));
  }
}

// How many blocks ahead of the one being read the rows are prefetched (into L2).
constexpr int64_t PREFETCH_BLOCKS = 2;

// Calls visit(t, slot) for tokens 0..len-1 of a sequence, block by block through its table, and
// prefetches the `row_bytes` at rows + slot * stride of the token as far ahead in the table (one
// row per token visited). A head's rows are 256 bytes apart by 2 KiB (the other heads' between
// them) in blocks scattered over the pool, which the hardware prefetchers do not follow: without
// this, decode attention at 4k tokens read 10-12 GB/s, with it ~20 (Zen 4, 2 threads, the same bits).
template <typename KV, typename Visit>
QS_INLINE void for_each_slot(const int64_t* table, int64_t len, int64_t block_size, const KV* rows, int64_t stride,
                             int64_t row_bytes, Visit&& visit) {
  const int64_t blocks = (len + block_size - 1) / block_size;
  for (int64_t t0 = 0, block = 0; t0 < len; t0 += block_size, block++) {
    const bool prefetch = block + PREFETCH_BLOCKS < blocks;
    const int64_t ahead = prefetch ? table[block + PREFETCH_BLOCKS] * block_size : 0;
    const int64_t base = table[block] * block_size, n = len - t0 < block_size ? len - t0 : block_size;
    for (int64_t i = 0; i < n; i++) {
      if (prefetch) {
        const char* row = reinterpret_cast<const char*>(rows + (ahead + i) * stride);
        for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T2);
      }
      visit(t0 + i, base + i);
    }
  }
}

// Scores of NT tokens (their key rows k[0..NT)) for one query head: NT independent FMA chains
// (one chain per token would wait on the FMA latency at every step).
template <typename KV, int NT>
QS_INLINE void score_tokens(const float* q, int64_t D, const KV* const* k, float scale, float* s) {
  __m512 dot[NT];
  for (int i = 0; i < NT; i++) dot[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 qd = _mm512_loadu_ps(q + d);
    for (int i = 0; i < NT; i++) dot[i] = _mm512_fmadd_ps(qd, load16(k[i] + d), dot[i]);
  }
  for (int i = 0; i < NT; i++) s[i] = _mm512_reduce_add_ps(dot[i]) * scale;
}

// out[h][d0 .. d0 + 16 DV) = sum_t p[h][t] v_t for NH heads, the sums held in registers for the
// whole history (NH * DV accumulators, each value vector loaded once for all NH heads).
template <typename KV, int NH, int DV>
QS_INLINE void weigh_values(const float* p, int64_t len, const KV* values, int64_t stride, const int64_t* table,
                            int64_t block_size, int64_t d0, float* out, int64_t D) {
  __m512 acc[NH][DV];
  for (int h = 0; h < NH; h++)
    for (int j = 0; j < DV; j++) acc[h][j] = _mm512_setzero_ps();
  for_each_slot(table, len, block_size, values + d0, stride, DV * 16 * int64_t{sizeof(KV)}, [&](int64_t t, int64_t slot) {
    const KV* v = values + slot * stride + d0;
    __m512 val[DV];
    for (int j = 0; j < DV; j++) val[j] = load16(v + 16 * j);
    for (int h = 0; h < NH; h++) {
      const __m512 weight = _mm512_set1_ps(p[h * len + t]);
      for (int j = 0; j < DV; j++) acc[h][j] = _mm512_fmadd_ps(weight, val[j], acc[h][j]);
    }
  });
  for (int h = 0; h < NH; h++)
    for (int j = 0; j < DV; j++) _mm512_storeu_ps(out + h * D + d0 + 16 * j, acc[h][j]);
}

template <typename KV, int NH>
void weigh_columns(const float* p, int64_t len, const KV* values, int64_t stride, const int64_t* table,
                   int64_t block_size, float* out, int64_t D) {
  for (int64_t d0 = 0; d0 < D; d0 += 128)  // up to 8 vectors of columns at a time
    with_count_1_to_8((D - d0) / 16, [&](auto vectors) {
      weigh_values<KV, NH, decltype(vectors)::value>(p, len, values, stride, table, block_size, d0, out, D);
    });
}

constexpr int SCORE_TOKENS = 8;

// The G query heads that share one kv head, over one sequence: q and out are [G, D]; keys and
// values point at this kv head's first element in slot 0, rows of `stride` elements; scores is
// room for [G, len].
template <typename KV>
void attend(const float* q, int64_t G, int64_t D, const KV* keys, const KV* values, int64_t stride,
            const int64_t* table, int64_t len, int64_t block_size, float scale, float* out, float* scores) {
  const KV* rows[SCORE_TOKENS];
  int64_t first = 0, filled = 0;
  auto flush = [&]() {
    for (int64_t h = 0; h < G; h++) {
      float* s = scores + h * len + first;
      if (filled == SCORE_TOKENS) score_tokens<KV, SCORE_TOKENS>(q + h * D, D, rows, scale, s);
      else
        for (int64_t i = 0; i < filled; i++) score_tokens<KV, 1>(q + h * D, D, rows + i, scale, s + i);
    }
    first += filled;
    filled = 0;
  };
  for_each_slot(table, len, block_size, keys, stride, D * int64_t{sizeof(KV)}, [&](int64_t, int64_t slot) {
    rows[filled++] = keys + slot * stride;
    if (filled == SCORE_TOKENS) flush();
  });
  flush();
  for (int64_t h = 0; h < G; h++) softmax_in_place(scores + h * len, len);
  for (int64_t h = 0; h < G; h += 2) {  // two heads per pass over the values
    if (G - h >= 2) weigh_columns<KV, 2>(scores + h * len, len, values, stride, table, block_size, out + h * D, D);
    else weigh_columns<KV, 1>(scores + h * len, len, values, stride, table, block_size, out + h * D, D);
  }
}

template <typename KV>
void decode_tasks(const float* q, int64_t q_stride, int64_t H, int64_t D, const KV* key_cache, const KV* value_cache, int64_t Hkv,
                  const int64_t* block_tables, int64_t max_blocks, const int64_t* lengths, int64_t block_size,
                  float scale, float* out, int64_t task_begin, int64_t task_end) {
  const int64_t G = H / Hkv;
  std::vector<float> scores;
  for (int64_t task = task_begin; task < task_end; task++) {
    const int64_t b = task / Hkv, kvh = task % Hkv, head = b * H + kvh * G;
    scores.resize(G * lengths[b]);
    attend<KV>(q + b * q_stride + kvh * G * D, G, D, key_cache + kvh * D, value_cache + kvh * D, Hkv * D, block_tables + b * max_blocks,
               lengths[b], block_size, scale, out + head * D, scores.data());
  }
}

}  // namespace
#pragma GCC pop_options

void paged_decode_avx512(const float* q, int64_t q_stride, int64_t B, int64_t H, int64_t D, const void* key_cache,
                         const void* value_cache, bool kv_bf16, int64_t Hkv, const int64_t* block_tables,
                         int64_t max_blocks, const int64_t* lengths, int64_t block_size, float scale, float* out) {
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    if (kv_bf16)
      decode_tasks(q, q_stride, H, D, static_cast<const uint16_t*>(key_cache), static_cast<const uint16_t*>(value_cache), Hkv,
                   block_tables, max_blocks, lengths, block_size, scale, out, begin, end);
    else
      decode_tasks(q, q_stride, H, D, static_cast<const float*>(key_cache), static_cast<const float*>(value_cache), Hkv,
                   block_tables, max_blocks, lengths, block_size, scale, out, begin, end);
  });
}

}  // namespace qs
