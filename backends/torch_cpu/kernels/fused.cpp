// Element-wise steps of a decoder layer fused into one pass each (float32): RMSNorm (with the
// residual add before it), the per-head q/k RMSNorm of Qwen3 with the rotary embedding, and
// SiLU(gate) * up. At decode each of them was five to fifteen small torch ops, whose dispatch
// cost, not their arithmetic, took a quarter of a single-stream step. Rows are independent, so
// a row's result does not depend on how many rows the step has.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace qs {
namespace {

inline float inverse_rms(const float* x, int64_t n, float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; i++) sum += x[i] * x[i];
  return 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
}

inline void scale_row(const float* x, const float* w, float inv, int64_t n, float* y) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * inv);
}

constexpr int64_t ROW_GRAIN = 4;

}  // namespace

void rms_norm(const float* x, int64_t T, int64_t H, const float* w, float eps, float* y) {
  at::parallel_for(0, T, ROW_GRAIN, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) scale_row(x + t * H, w, inverse_rms(x + t * H, H, eps), H, y + t * H);
  });
}

void add_rms_norm(float* hidden, const float* delta, int64_t T, int64_t H, const float* w, float eps, float* y) {
  at::parallel_for(0, T, ROW_GRAIN, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) {
      float* h = hidden + t * H;
      const float* d = delta + t * H;
#pragma omp simd
      for (int64_t i = 0; i < H; i++) h[i] += d[i];
      scale_row(h, w, inverse_rms(h, H, eps), H, y + t * H);
    }
  });
}

// x [T, heads, D] in place, token t's heads starting at x + t * row_stride (x may be the q, k or v
// columns of a merged projection's output): RMSNorm over each head (when w is not null), then
// x * cos + rotate_half(x) * sin with cos, sin [T, D].
void head_norm_rope(float* x, int64_t T, int64_t row_stride, int64_t heads, int64_t D, const float* w, float eps,
                    const float* cos, const float* sin) {
  const int64_t half = D / 2;
  at::parallel_for(0, T * heads, ROW_GRAIN * heads, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      float* v = x + (r / heads) * row_stride + (r % heads) * D;
      const float* c = cos + (r / heads) * D;
      const float* s = sin + (r / heads) * D;
      if (w != nullptr) scale_row(v, w, inverse_rms(v, D, eps), D, v);
      for (int64_t i = 0; i < half; i++) {  // element i pairs with i + half only: in place
        const float first = v[i], second = v[i + half];
        v[i] = first * c[i] - second * s[i];
        v[i + half] = second * c[i + half] + first * s[i + half];
      }
    }
  });
}

// gate and up [T, n] at row strides of their own (the halves of a merged gate/up output), y [T, n].
void silu_mul(const float* gate, const float* up, int64_t T, int64_t n, int64_t gate_stride, int64_t up_stride,
              float* y) {
  at::parallel_for(0, T * n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t t = b / n; t * n < e; t++) {
      const int64_t from = std::max(b, t * n) - t * n, to = std::min(e, (t + 1) * n) - t * n;
      const float* g = gate + t * gate_stride;
      const float* u = up + t * up_stride;
      float* out = y + t * n;
#pragma omp simd
      for (int64_t i = from; i < to; i++) out[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
}

}  // namespace qs
