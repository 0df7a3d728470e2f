// Gated DeltaNet's decode step in one call (kernels.h, gated_delta_decode): per sequence the causal
// convolution over its last inputs, the L2 norms of q and k, and per value head the delta-rule
// update of its [dk, dv] state, read and written where the storage keeps it. Done with torch ops,
// the states were gathered into a batch and scattered back (two extra copies of every state, a
// megabyte per layer per sequence for Qwen3.5-0.8B) around a dozen small ops per layer.
//
// The state is read twice per head: decay it while taking S^T k (the rule's prediction), then add
// k delta^T while taking S^T q. A head's 64 KiB stays in L2 between the passes, so memory sees one
// read and one write of it.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace qs {
namespace {

constexpr int64_t MAX_VALUE_DIM = 512;  // a head's value width (Qwen3.5, Qwen3-Next: 128); ops.cpp checks

QS_INLINE float inverse_norm(const float* x, int64_t n, float eps, bool mean) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; i++) sum += x[i] * x[i];
  return 1.f / std::sqrt((mean ? sum / static_cast<float>(n) : sum) + eps);
}

// The convolution of one sequence's new input x [C] over its history [taps - 1, C] (shifted in
// place to end with x), into y [C] before the SiLU.
QS_INLINE void convolve(const float* x, const float* w, int64_t taps, int64_t C, float* history, bool fresh,
                        float* y) {
  const int64_t kept = taps - 1;
  if (fresh)
    for (int64_t i = 0; i < kept * C; i++) history[i] = 0.f;
  for (int64_t c = 0; c < C; c++) y[c] = w[c * taps + kept] * x[c];
  for (int64_t j = 0; j < kept; j++) {
    const float* h = history + j * C;
    for (int64_t c = 0; c < C; c++) y[c] += w[c * taps + j] * h[c];
  }
  for (int64_t j = 0; j + 1 < kept; j++) std::copy(history + (j + 1) * C, history + (j + 2) * C, history + j * C);
  if (kept > 0) std::copy(x, x + C, history + (kept - 1) * C);
}

// One value head: S [dk, dv] <- a S; delta = beta (v - S^T k); S += k delta^T; out = S^T q.
QS_INLINE void update_head(float* S, const float* q, const float* k, const float* v, float a, float beta, int64_t dk,
                           int64_t dv, bool fresh, float* out) {
  float delta[MAX_VALUE_DIM] = {};
  if (fresh)
    for (int64_t i = 0; i < dk * dv; i++) S[i] = 0.f;
  for (int64_t i = 0; i < dk; i++) {
    float* row = S + i * dv;
    const float ki = k[i];
#pragma omp simd
    for (int64_t j = 0; j < dv; j++) {
      row[j] *= a;
      delta[j] += row[j] * ki;
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < dv; j++) {
    delta[j] = beta * (v[j] - delta[j]);
    out[j] = 0.f;
  }
  for (int64_t i = 0; i < dk; i++) {
    float* row = S + i * dv;
    const float ki = k[i], qi = q[i];
#pragma omp simd
    for (int64_t j = 0; j < dv; j++) {
      row[j] += ki * delta[j];
      out[j] += row[j] * qi;
    }
  }
}

QS_INLINE void decode_body(const float* mixed, int64_t mixed_stride, const float* z, int64_t z_stride, int64_t B,
                           int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* conv_weight, int64_t taps,
                           float* conv_state, float* state, const int64_t* slots, const bool* fresh,
                           const float* decay, const float* beta, const float* norm_weight, float eps, float* out) {
  const int64_t C = 2 * Hk * dk + Hv * dv, kept = taps - 1, group = Hv / Hk;
  std::vector<float> convolved(B * C);
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
      float* y = convolved.data() + b * C;
      convolve(mixed + b * mixed_stride, conv_weight, taps, C, conv_state + slots[b] * kept * C, fresh[b], y);
      silu_row(y, C);
      const float q_scale = 1.f / std::sqrt(static_cast<float>(dk));
      for (int64_t h = 0; h < 2 * Hk; h++) {  // the queries' heads, then the keys'
        float* x = y + h * dk;
        const float scale = inverse_norm(x, dk, 1e-6f, false) * (h < Hk ? q_scale : 1.f);
        for (int64_t i = 0; i < dk; i++) x[i] *= scale;
      }
    }
  });
  at::parallel_for(0, B * Hv, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const int64_t b = r / Hv, h = r % Hv;
      const float* y = convolved.data() + b * C;
      const float* q = y + (h / group) * dk;
      const float* k = y + Hk * dk + (h / group) * dk;
      const float* v = y + 2 * Hk * dk + h * dv;
      float* o = out + b * Hv * dv + h * dv;
      update_head(state + (slots[b] * Hv + h) * dk * dv, q, k, v, decay[r], beta[r], dk, dv, fresh[b], o);
      const float inv = inverse_norm(o, dv, eps, true);
      const float* zh = z + b * z_stride + h * dv;
      for (int64_t j = 0; j < dv; j++) o[j] = norm_weight[j] * (o[j] * inv) * (zh[j] / (1.f + std::exp(-zh[j])));
    }
  });
}

QS_AVX512 void decode_avx512(const float* mixed, int64_t mixed_stride, const float* z, int64_t z_stride, int64_t B,
                             int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* conv_weight, int64_t taps,
                             float* conv_state, float* state, const int64_t* slots, const bool* fresh,
                             const float* decay, const float* beta, const float* norm_weight, float eps, float* out) {
  decode_body(mixed, mixed_stride, z, z_stride, B, Hk, Hv, dk, dv, conv_weight, taps, conv_state, state, slots, fresh,
              decay, beta, norm_weight, eps, out);
}

void decode_generic(const float* mixed, int64_t mixed_stride, const float* z, int64_t z_stride, int64_t B, int64_t Hk,
                    int64_t Hv, int64_t dk, int64_t dv, const float* conv_weight, int64_t taps, float* conv_state,
                    float* state, const int64_t* slots, const bool* fresh, const float* decay, const float* beta,
                    const float* norm_weight, float eps, float* out) {
  decode_body(mixed, mixed_stride, z, z_stride, B, Hk, Hv, dk, dv, conv_weight, taps, conv_state, state, slots, fresh,
              decay, beta, norm_weight, eps, out);
}

}  // namespace

void gated_delta_decode(const float* mixed, int64_t mixed_stride, const float* z, int64_t z_stride, int64_t B,
                        int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* conv_weight, int64_t taps,
                        float* conv_state, float* state, const int64_t* slots, const bool* fresh, const float* decay,
                        const float* beta, const float* norm_weight, float eps, float* out) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  (avx512 ? decode_avx512 : decode_generic)(mixed, mixed_stride, z, z_stride, B, Hk, Hv, dk, dv, conv_weight, taps,
                                            conv_state, state, slots, fresh, decay, beta, norm_weight, eps, out);
}

}  // namespace qs
