// Element-wise steps of a decoder layer fused into one pass each (float32): RMSNorm (with the
// residual add before it), the per-head q/k RMSNorm of Qwen3 with the rotary embedding, and
// SiLU(gate) * up. At decode each of them was five to fifteen small torch ops, whose dispatch
// cost, not their arithmetic, took a quarter of a single-stream step. Rows are independent, so
// a row's result does not depend on how many rows the step has.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common.h"
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
// columns of a merged projection's output): RMSNorm over each head (when w is not null), then on
// its first R dimensions (R = D, or fewer: partial rotary, Qwen3.5's quarter) x * cos +
// rotate_half(x) * sin with cos, sin [T, R]; the other D - R pass.
void head_norm_rope(float* x, int64_t T, int64_t row_stride, int64_t heads, int64_t D, int64_t R, const float* w,
                    float eps, const float* cos, const float* sin) {
  const int64_t half = R / 2;
  at::parallel_for(0, T * heads, ROW_GRAIN * heads, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      float* v = x + (r / heads) * row_stride + (r % heads) * D;
      const float* c = cos + (r / heads) * R;
      const float* s = sin + (r / heads) * R;
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
namespace {

// SiLU(g) * u (u null: SiLU(g)), or with Gate::sigmoid sigmoid(g) * u, for 16 floats at a time:
// sigmoid(g) from e = e^-|g| (never overflows) as 1 / (1 + e) for g >= 0 and e / (1 + e) below.
// std::exp in the scalar loop stayed scalar under omp simd (glibc's vector expf needs -ffast-math):
// 384 x 3072 took 4.43 ms against 0.41 ms here (Ice Lake).
enum class Gate { silu, sigmoid };

template <Gate G>
QS_AVX512 void gate_row_avx512(const float* g, const float* u, int64_t from, int64_t to, float* out) {
  const __m512 one = _mm512_set1_ps(1.f), sign = _mm512_set1_ps(-0.f);
  for (int64_t i = from; i < to; i += 16) {
    const __mmask16 keep = to - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (to - i)) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(keep, g + i), uv = u ? _mm512_maskz_loadu_ps(keep, u + i) : one;
    const __m512 e = exp_nonpositive(_mm512_or_ps(gv, sign));  // e^-|g|
    const __mmask16 negative = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_div_ps(_mm512_mask_blend_ps(negative, one, e), _mm512_add_ps(one, e));
    const __m512 gated = G == Gate::silu ? _mm512_mul_ps(gv, sigmoid) : sigmoid;
    _mm512_mask_storeu_ps(out + i, keep, _mm512_mul_ps(gated, uv));
  }
}

template <Gate G>
void gate_row_scalar(const float* g, const float* u, int64_t from, int64_t to, float* out) {
  for (int64_t i = from; i < to; i++) {
    const float sigmoid = 1.f / (1.f + std::exp(-g[i]));
    out[i] = (G == Gate::silu ? g[i] * sigmoid : sigmoid) * (u ? u[i] : 1.f);
  }
}

// The same 8 floats at a time (a scalar tail), for AVX2 CPUs: 512 x 3584 took 3.5 ms with the scalar
// loop on 2 Zen 3 cores.
template <Gate G>
QS_AVX2 void gate_row_avx2(const float* g, const float* u, int64_t from, int64_t to, float* out) {
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f), zero = _mm256_setzero_ps();
  int64_t i = from;
  for (; i + 8 <= to; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i), uv = u ? _mm256_loadu_ps(u + i) : one;
    const __m256 e = exp_nonpositive_avx2(_mm256_or_ps(gv, sign));  // e^-|g|
    const __m256 numerator = _mm256_blendv_ps(one, e, _mm256_cmp_ps(gv, zero, _CMP_LT_OQ));
    const __m256 sigmoid = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
    const __m256 gated = G == Gate::silu ? _mm256_mul_ps(gv, sigmoid) : sigmoid;
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gated, uv));
  }
  gate_row_scalar<G>(g, u, i, to, out);
}

using GateRow = void (*)(const float*, const float*, int64_t, int64_t, float*);

template <Gate G>
GateRow gate_row_kernel() {
  switch (cpu_width()) {
    case Width::avx512: return gate_row_avx512<G>;
    case Width::avx2: return gate_row_avx2<G>;
    default: return gate_row_scalar<G>;
  }
}

// y [T, n] = gate(g) * u over rows of g and u at strides of their own, split into runs of 2^14
// elements across threads.
template <Gate G>
void gated_rows(const float* g, const float* u, int64_t T, int64_t n, int64_t g_stride, int64_t u_stride, float* y) {
  const GateRow kernel = gate_row_kernel<G>();
  at::parallel_for(0, T * n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t t = b / n; t * n < e; t++) {
      const int64_t from = std::max(b, t * n) - t * n, to = std::min(e, (t + 1) * n) - t * n;
      kernel(g + t * g_stride, u + t * u_stride, from, to, y + t * n);
    }
  });
}

}  // namespace

void silu_mul(const float* gate, const float* up, int64_t T, int64_t n, int64_t gate_stride, int64_t up_stride,
              float* y) {
  gated_rows<Gate::silu>(gate, up, T, n, gate_stride, up_stride, y);
}

void sigmoid_mul(float* x, const float* gate, int64_t T, int64_t n, int64_t gate_stride) {
  gated_rows<Gate::sigmoid>(gate, x, T, n, gate_stride, n, x);
}

void silu_row(float* x, int64_t n) { gate_row_kernel<Gate::silu>()(x, nullptr, 0, n, x); }

void route_top_k(const float* logits, int64_t T, int64_t n, int64_t top_k, bool normalize, float* weights,
                 int64_t* chosen) {
  at::parallel_for(0, T, ROW_GRAIN, [&](int64_t b, int64_t e) {
    std::vector<float> probability(n);
    std::vector<int64_t> order(n);
    for (int64_t t = b; t < e; t++) {
      const float* row = logits + t * n;
      const float top = *std::max_element(row, row + n);
      float sum = 0.f;
      for (int64_t i = 0; i < n; i++) sum += probability[i] = std::exp(row[i] - top);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int64_t i, int64_t j) {
        return probability[i] > probability[j] || (probability[i] == probability[j] && i < j);
      });
      float kept = 0.f;
      for (int64_t j = 0; j < top_k; j++) {
        chosen[t * top_k + j] = order[j];
        kept += weights[t * top_k + j] = probability[order[j]] / sum;
      }
      if (normalize)
        for (int64_t j = 0; j < top_k; j++) weights[t * top_k + j] /= kept;
    }
  });
}

void add_sigmoid_gated(float* out, const float* x, const float* gate, int64_t gate_stride, int64_t T, int64_t n) {
  for (int64_t t = 0; t < T; t++) {
    const float scale = 1.f / (1.f + std::exp(-gate[t * gate_stride]));
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[t * n + i] += scale * x[t * n + i];
  }
}

}  // namespace qs
