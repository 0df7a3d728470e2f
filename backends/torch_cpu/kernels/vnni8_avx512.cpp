// The VNNI int4 / int8 matmuls on the blocked layouts, with activations as int8 per group of 64:
// vpdpbusd multiplies 4 byte pairs per 32-bit lane, twice the products of the int16 vpdpwssd
// (int4_avx512_body.inc). From 8 rows of x on, those kernels were bound by their multiply-adds
// (and the broadcasts and unpacking that feed them); here each instruction does twice the work.
// int8 activations are what llama.cpp's Q4_0 / Q8_0 dot products use too (Q8_0, per 32).
//
// The blocked layouts are not changed: one vpermw per 64 bytes puts each output row's 4 bytes
// (two 16-bit words of consecutive chunks) side by side in its lane.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace qs {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
namespace {

struct Activations8 {
  std::vector<int8_t> q;  // [M, K]: for int4 each 8 inputs in the order 0 1 4 5 2 3 6 7 (below)
  std::vector<float> scale;  // [M, K / 64]
  std::vector<float> sum;  // [M, K / 64], exact float sums for the int4 zero points
  std::vector<int32_t> qsum;  // [M, K / 64], sums of q (to center the int4 codes, and the int8 ones)
};

// Lane r of a permuted 64-byte load: word r (the first 32 bytes) and word 16 + r (the next 32).
QS_INLINE __m512i pair_words() {
  alignas(64) int16_t index[32];
  for (int r = 0; r < 16; r++) index[2 * r] = static_cast<int16_t>(r), index[2 * r + 1] = static_cast<int16_t>(16 + r);
  return _mm512_load_si512(index);
}

// int4: after the permute, lane r holds (low nibbles) inputs 0 1 4 5 and (high) 2 3 6 7 of each
// 8, so the activations are stored in that order: 16-bit words 0 2 1 3 of every 4. int8
// (nibble_order false): natural order.
Activations8 quantize8(const float* x, int64_t M, int64_t K, bool nibble_order) {
  const int64_t groups = M * K / GROUP;
  Activations8 a{std::vector<int8_t>(M * K), std::vector<float>(groups), std::vector<float>(groups),
                 std::vector<int32_t>(groups)};
  alignas(64) int16_t order[32];
  for (int i = 0; i < 32; i++) order[i] = static_cast<int16_t>((i & ~3) | (nibble_order ? (i & 1) * 2 + (i & 2) / 2 : i & 3));
  const __m512i words = _mm512_load_si512(order);
  for (int64_t i = 0; i < groups; i++) {
    __m512 v[4];
    const float top = load_group_avx512(x + i * GROUP, v, &a.sum[i]);
    const __m512 inv = _mm512_set1_ps(top > 0.f ? 127.f / top : 0.f);
    __m512i bytes = _mm512_setzero_si512(), qsum = _mm512_setzero_si512();
    for (int j = 0; j < 4; j++) {
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[j], inv));
      qsum = _mm512_add_epi32(qsum, q);
      bytes = _mm512_inserti32x4(bytes, _mm512_cvtsepi32_epi8(q), j);
    }
    a.qsum[i] = _mm512_reduce_add_epi32(qsum);
    if (nibble_order) bytes = _mm512_permutexvar_epi16(words, bytes);
    _mm512_storeu_si512(a.q.data() + i * GROUP, bytes);
    a.scale[i] = top / 127.f;
  }
  return a;
}

QS_INLINE __m512i broadcast4(const int8_t* p) {  // one vpbroadcastd from memory
  int32_t four;
  __builtin_memcpy(&four, p, 4);
  return _mm512_set1_epi32(four);
}

// acc += the 4-byte dot products of a (unsigned) and b (signed) per lane, in place. Through the
// intrinsic, gcc 12 copied every accumulator to another register around each vpdpbusd and
// spilled one to the stack per step; pinned in place, Qwen3-0.6B's int8 head ([151936, 1024])
// at 16 rows took 7.7-8.1 ms instead of 10.9 (8 rows: 3.8-4.4 instead of 4.9-6.2).
QS_INLINE void dpbusd(__m512i& acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

constexpr int TILE_ROWS = 8;

// One block of 16 output rows of int4 ([groups][16 chunks][16 rows][2 bytes]) times MT rows.
// w = s q + z is taken as s (q - 8) + (z + 8 s): the activations' rounding error then meets the
// centered codes, not codes 0..15 that all lean one way (which doubled the error). The sum over
// q - 8 is the integer dot minus 8 times the activations' code sum, exact.
// CHAINS: with one or two rows of x the vpdpbusd of a row each wait for the last (a latency of
// several cycles), so a decode step's rows add into 4 or 2 independent sums, added at the group's end.
// Not inlined (nor q8_tile): each row count gets its own registers; inlined into the caller's
// loop, gcc spilled accumulators at 3 and 4 rows, and a 6,144 x 2,048 int8 matmul took longer at
// 4 rows than at 8 (Zen 4).
template <int MT, int CHAINS = (MT == 1 ? 4 : MT == 2 ? 2 : 1)>
__attribute__((noinline)) void q4_tile(const Activations8& a, int64_t m0, int64_t K, const uint8_t* block, const uint16_t* scale,
                       const uint16_t* zero, float* y, int64_t N, int64_t n0, __m512i pairs) {
  const int64_t groups = K / GROUP;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MT];
  for (int m = 0; m < MT; m++) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* wg = block + g * 512;
    const int8_t* xg = a.q.data() + m0 * K + g * GROUP;
    __m512i dot[MT][CHAINS];
    for (int m = 0; m < MT; m++)
      for (int k = 0; k < CHAINS; k++) dot[m][k] = _mm512_setzero_si512();
    for (int c = 0; c < 8; c++) {  // 8 inputs: chunks 2c and 2c + 1
      const __m512i w = _mm512_permutexvar_epi16(pairs, _mm512_loadu_si512(wg + c * 64));
      const __m512i lo = _mm512_and_si512(w, low4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
      const int k_lo = CHAINS == 4 ? 2 * (c & 1) : 0, k_hi = CHAINS == 1 ? 0 : k_lo + 1;
      for (int m = 0; m < MT; m++) {
        dpbusd(dot[m][k_lo], lo, broadcast4(xg + m * K + 8 * c));
        dpbusd(dot[m][k_hi], hi, broadcast4(xg + m * K + 8 * c + 4));
      }
    }
    for (int m = 0; m < MT; m++)
      for (int k = 1; k < CHAINS; k++) dot[m][0] = _mm512_add_epi32(dot[m][0], dot[m][k]);
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale + g * 16)));
    const __m512 z = _mm512_fmadd_ps(_mm512_set1_ps(8.f), s,
                                     _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(zero + g * 16))));
    for (int m = 0; m < MT; m++) {
      const int64_t i = (m0 + m) * groups + g;
      const __m512i centered = _mm512_sub_epi32(dot[m][0], _mm512_set1_epi32(8 * a.qsum[i]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centered), _mm512_mul_ps(s, _mm512_set1_ps(a.scale[i])), acc[m]);
      acc[m] = _mm512_fmadd_ps(z, _mm512_set1_ps(a.sum[i]), acc[m]);
    }
  }
  const __mmask16 keep = N - n0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (N - n0)) - 1);
  for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + (m0 + m) * N + n0, keep, acc[m]);
}

// One block of 16 output rows of int8 ([K/2][16 rows][2 inputs]) times MT rows. vpdpbusd wants
// one unsigned side: the weights' sign bits are flipped as they are loaded (q + 128, an XOR beside
// the permute), and 128 times the activations' code sum is taken off again, exact. That replaced
// a vpdpbusd per 64 bytes summing the weights, which on Zen 4 (a 512-bit vpdpbusd every ~0.6 ns
// a core) was half of a decode row's multiply-adds. CHAINS as q4_tile's.
template <int MT, int CHAINS = (MT == 1 ? 4 : MT == 2 ? 2 : 1)>
__attribute__((noinline)) void q8_tile(const Activations8& a, int64_t m0, int64_t K, const int8_t* block, const float* scale,
                       float* y, int64_t N, int64_t n0, __m512i pairs) {
  const int64_t groups = K / GROUP;
  const __m512i sign = _mm512_set1_epi8(-128);
  __m512 acc[MT];
  for (int m = 0; m < MT; m++) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    const int8_t* wg = block + g * GROUP * 16;
    const int8_t* xg = a.q.data() + m0 * K + g * GROUP;
    __m512i dot[MT][CHAINS];
    for (int m = 0; m < MT; m++)
      for (int k = 0; k < CHAINS; k++) dot[m][k] = _mm512_setzero_si512();
    for (int p = 0; p < GROUP / 4; p++) {  // 4 inputs: pairs 2p and 2p + 1
      const __m512i w = _mm512_xor_si512(_mm512_permutexvar_epi16(pairs, _mm512_loadu_si512(wg + p * 64)), sign);
      for (int m = 0; m < MT; m++) dpbusd(dot[m][p % CHAINS], w, broadcast4(xg + m * K + 4 * p));
    }
    for (int m = 0; m < MT; m++) {
      const int64_t i = (m0 + m) * groups + g;
      for (int k = 1; k < CHAINS; k++) dot[m][0] = _mm512_add_epi32(dot[m][0], dot[m][k]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot[m][0], _mm512_set1_epi32(128 * a.qsum[i]))),
                               _mm512_set1_ps(a.scale[i]), acc[m]);
    }
  }
  const __mmask16 keep = N - n0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (N - n0)) - 1);
  const __m512 s = _mm512_loadu_ps(scale + n0);  // the scales are padded to whole blocks
  for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + (m0 + m) * N + n0, keep, _mm512_mul_ps(acc[m], s));
}

// One block of 16 output rows of int6 ([groups][4][3 vectors], blocked_layout.block_int6) times MT
// rows. The codes are c + 32, unsigned for vpdpbusd, and 32 times the activations' code sum is
// taken off again, exact. Each operand (4 inputs x 16 rows) is one bitwise select of a nibble
// vector (shifted by 2 for the odd ones, whose nibble holds the code's top 4 bits) and a bit-pair
// vector masked to bits 0-1 and 4-5, so the other half of each byte falls away: 9 shifts, ands and
// selects per 4 operands, no more than the int8 rows' permute and sign flip. One weight scale per
// row and group (float16), as llama.cpp's Q6_K keeps its output layer: 6.25 bits a weight where
// int8 rows take 8.
template <int MT, int CHAINS = (MT == 1 ? 4 : MT == 2 ? 2 : 1)>
__attribute__((noinline)) void q6_tile(const Activations8& a, int64_t m0, int64_t K, const uint8_t* block,
                                       const uint16_t* scale, float* y, int64_t N, int64_t n0) {
  const int64_t groups = K / GROUP;
  const __m512i fields = _mm512_set1_epi8(0x33), low4 = _mm512_set1_epi8(0x0F), middle4 = _mm512_set1_epi8(0x3C);
  constexpr int SELECT = 0xE4;  // vpternlogd: c ? a : b, bit by bit
  __m512 acc[MT];
  for (int m = 0; m < MT; m++) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* wg = block + g * Q6_GROUP_BYTES;
    const int8_t* xg = a.q.data() + m0 * K + g * GROUP;
    __m512i dot[MT][CHAINS];
    for (int m = 0; m < MT; m++)
      for (int k = 0; k < CHAINS; k++) dot[m][k] = _mm512_setzero_si512();
    for (int h = 0; h < 4; h++) {  // operands 4h .. 4h + 3: inputs 16h .. 16h + 15
      const __m512i nibbles0 = _mm512_loadu_si512(wg + h * 192), nibbles1 = _mm512_loadu_si512(wg + h * 192 + 64);
      const __m512i pairs = _mm512_loadu_si512(wg + h * 192 + 128);
      const __m512i even = _mm512_and_si512(pairs, fields), odd = _mm512_and_si512(_mm512_srli_epi16(pairs, 2), fields);
      const __m512i ops[4] = {
          _mm512_ternarylogic_epi32(nibbles0, even, low4, SELECT),
          _mm512_ternarylogic_epi32(_mm512_srli_epi16(nibbles0, 2), even, middle4, SELECT),
          _mm512_ternarylogic_epi32(nibbles1, odd, low4, SELECT),
          _mm512_ternarylogic_epi32(_mm512_srli_epi16(nibbles1, 2), odd, middle4, SELECT)};
      for (int k = 0; k < 4; k++)
        for (int m = 0; m < MT; m++) dpbusd(dot[m][k % CHAINS], ops[k], broadcast4(xg + m * K + 16 * h + 4 * k));
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale + g * 16)));
    for (int m = 0; m < MT; m++) {
      const int64_t i = (m0 + m) * groups + g;
      for (int k = 1; k < CHAINS; k++) dot[m][0] = _mm512_add_epi32(dot[m][0], dot[m][k]);
      const __m512i centered = _mm512_sub_epi32(dot[m][0], _mm512_set1_epi32(32 * a.qsum[i]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centered), _mm512_mul_ps(s, _mm512_set1_ps(a.scale[i])), acc[m]);
    }
  }
  const __mmask16 keep = N - n0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (N - n0)) - 1);
  for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + (m0 + m) * N + n0, keep, acc[m]);
}

// tile(b, m0, rows) for every block in [b_begin, b_end) and every TILE_ROWS rows of x.
template <typename Tile>
void each_tile(int64_t M, int64_t b_begin, int64_t b_end, Tile&& tile) {
  for (int64_t b = b_begin; b < b_end; b++)
    for (int64_t m0 = 0; m0 < M; m0 += TILE_ROWS)
      with_count_1_to_8(M - m0, [&](auto rows) { tile(b, m0, rows); });
}

}  // namespace

void q4b_matmul_vnni8(const float* x, int64_t M, int64_t K, const uint8_t* codes, const uint16_t* scale,
                      const uint16_t* zero, int64_t N, float* y) {
  const Activations8 a = quantize8(x, M, K, true);
  const int64_t groups = K / GROUP;
  const __m512i pairs = pair_words();
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t b_begin, int64_t b_end) {
    each_tile(M, b_begin, b_end, [&](int64_t b, int64_t m0, auto rows) {
      q4_tile<decltype(rows)::value>(a, m0, K, codes + b * groups * 512, scale + b * groups * 16,
                                     zero + b * groups * 16, y, N, b * 16, pairs);
    });
  });
}

void q8b_matmul_vnni8(const float* x, int64_t M, int64_t K, const int8_t* codes, const float* scale, int64_t N,
                      float* y) {
  const Activations8 a = quantize8(x, M, K, false);
  const __m512i pairs = pair_words();
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t b_begin, int64_t b_end) {
    each_tile(M, b_begin, b_end, [&](int64_t b, int64_t m0, auto rows) {
      q8_tile<decltype(rows)::value>(a, m0, K, codes + b * K * 16, scale, y, N, b * 16, pairs);
    });
  });
}

void q6b_matmul_vnni8(const float* x, int64_t M, int64_t K, const uint8_t* codes, const uint16_t* scale, int64_t N,
                      float* y) {
  const Activations8 a = quantize8(x, M, K, false);
  const int64_t groups = K / GROUP;
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t b_begin, int64_t b_end) {
    each_tile(M, b_begin, b_end, [&](int64_t b, int64_t m0, auto rows) {
      q6_tile<decltype(rows)::value>(a, m0, K, codes + b * groups * Q6_GROUP_BYTES, scale + b * groups * 16, y, N, b * 16);
    });
  });
}

// A mixture-of-experts MLP (kernels.h): the (token, slot) pairs sorted by expert, then the
// active experts in waves of about WAVE_ROWS pairs: each wave's rows gathered and quantized once
// per projection, one parallel loop over every (expert, block of 16 outputs) for gate/up and one
// for down (an expert's weights stream once per call however many tokens chose it, and no
// thread waits at a per-expert barrier), and the weighted outputs added to their tokens in
// expert order. The waves keep a prefill chunk's intermediates in cache: all 4,096 pairs of a
// 512-token chunk at once took 1.6x the time of the experts run one by one.
constexpr int64_t WAVE_ROWS = 256;

void q4b_moe_vnni8(const float* x, int64_t T, int64_t H, int64_t top_k, const int64_t* chosen, const float* route,
                   const int64_t* table, int64_t E, int64_t I, float* out) {
  const int64_t P = T * top_k;
  std::vector<int64_t> start(E + 1, 0), slot_at(P);
  for (int64_t p = 0; p < P; p++) start[chosen[p] + 1]++;
  for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < P; p++) slot_at[next[chosen[p]]++] = p;
  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; e++)
    if (start[e + 1] > start[e]) active.push_back(e);
  std::fill(out, out + T * H, 0.f);

  const __m512i pairs = pair_words();
  std::vector<float> rows, gate_up, act, down;
  for (size_t first = 0; first < active.size();) {
    size_t last = first + 1;  // the wave: experts active[first, last), pairs [r0, r1)
    const int64_t r0 = start[active[first]];
    while (last < active.size() && start[active[last] + 1] - r0 <= WAVE_ROWS) last++;
    const int64_t r1 = start[active[last - 1] + 1], n = r1 - r0;
    rows.resize(n * H), gate_up.resize(n * 2 * I), act.resize(n * I), down.resize(n * H);
    for (int64_t q = 0; q < n; q++)
      __builtin_memcpy(rows.data() + q * H, x + slot_at[r0 + q] / top_k * H, H * sizeof(float));
    // y [n, N] = the wave's rows (quantized as a) times each one's expert's projection `field`
    // (0 gate/up, 3 down: codes, scale and zero addresses in the table).
    auto project = [&](const Activations8& a, int64_t K, int64_t N, int field, float* y) {
      const int64_t groups = K / GROUP, blocks = (N + 15) / 16;
      at::parallel_for(0, static_cast<int64_t>(last - first) * blocks, 1, [&](int64_t i_begin, int64_t i_end) {
        for (int64_t i = i_begin; i < i_end; i++) {
          const int64_t e = active[first + i / blocks], b = i % blocks;
          const int64_t* address = table + e * 6 + field;
          const uint8_t* codes = reinterpret_cast<const uint8_t*>(address[0]) + b * groups * 512;
          const uint16_t* scale = reinterpret_cast<const uint16_t*>(address[1]) + b * groups * 16;
          const uint16_t* zero = reinterpret_cast<const uint16_t*>(address[2]) + b * groups * 16;
          for (int64_t m0 = start[e] - r0; m0 < start[e + 1] - r0; m0 += TILE_ROWS)
            with_count_1_to_8(start[e + 1] - r0 - m0, [&](auto count) {
              q4_tile<decltype(count)::value>(a, m0, K, codes, scale, zero, y, N, b * 16, pairs);
            });
        }
      });
    };
    project(quantize8(rows.data(), n, H, true), H, 2 * I, 0, gate_up.data());
    silu_mul(gate_up.data(), gate_up.data() + I, n, I, 2 * I, 2 * I, act.data());
    project(quantize8(act.data(), n, I, true), I, H, 3, down.data());
    at::parallel_for(0, H, 256, [&](int64_t h_begin, int64_t h_end) {  // columns apart: no two threads add to one
      for (int64_t q = 0; q < n; q++) {
        const int64_t slot = slot_at[r0 + q];
        const float w = route[slot];
        float* o = out + slot / top_k * H;
        const float* y = down.data() + q * H;
        for (int64_t h = h_begin; h < h_end; h++) o[h] += w * y[h];
      }
    });
    first = last;
  }
}

#pragma GCC pop_options

}  // namespace qs
