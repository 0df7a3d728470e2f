// Gated DeltaNet's decode step in one call (kernels.h, gated_delta_decode): per sequence the causal
// convolution over its last inputs, the L2 norms of q and k, and per value head the delta-rule
// update of its [dk, dv] state, read and written where the storage keeps it. Done with torch ops,
// the states were gathered into a batch and scattered back (two extra copies of every state, a
// megabyte per layer per sequence for Qwen3.5-0.8B) around a dozen small ops per layer.
//
// The chunked form's triangular solve (unit_lower_solve) is here too: LAPACK's trsm, which
// torch.linalg.solve_triangular calls once per head, took ~0.6 ms for 16 heads of a 32-token block
// (~25 GFLOP/s), a tenth of a 1,600-token bf16 prefill of Qwen3.5-0.8B on 2 Zen 4 cores.
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

#define QS_DECODE_ARGS                                                                                                \
  const float *mixed, int64_t mixed_stride, const float *z, int64_t z_stride, int64_t B, int64_t Hk, int64_t Hv,     \
      int64_t dk, int64_t dv, const float *conv_weight, int64_t taps, float *conv_state, float *state,               \
      const int64_t *slots, const int64_t *write_slots, const bool *fresh, const float *gates, int64_t gates_stride, \
      const float *decay_rate, const float *dt_bias, const float *norm_weight, float eps, float *out
#define QS_DECODE_CALL                                                                                                 \
  mixed, mixed_stride, z, z_stride, B, Hk, Hv, dk, dv, conv_weight, taps, conv_state, state, slots, write_slots,      \
      fresh, gates, gates_stride, decay_rate, dt_bias, norm_weight, eps, out
#define QS_CONV_ARGS                                                                                                  \
  const float *mixed, int64_t mixed_stride, int64_t T, int64_t Hk, int64_t dk, int64_t C, const float *conv_weight,  \
      int64_t taps, float *history, float *out
#define QS_CONV_CALL mixed, mixed_stride, T, Hk, dk, C, conv_weight, taps, history, out
#define QS_GATE_ARGS \
  float *out, const float *z, int64_t z_stride, int64_t T, int64_t Hv, int64_t dv, const float *norm_weight, float eps
#define QS_GATE_CALL out, z, z_stride, T, Hv, dv, norm_weight, eps
#define QS_SOLVE_ARGS const float *system, int64_t H, int64_t n, float *rhs, int64_t cols
#define QS_SOLVE_CALL system, H, n, rhs, cols

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace delta_avx512 {
#include "delta_rule_body.inc"
}  // namespace delta_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace delta_avx2 {
#include "delta_rule_body.inc"
}  // namespace delta_avx2
#pragma GCC pop_options

namespace delta_generic {
#include "delta_rule_body.inc"
}  // namespace delta_generic

}  // namespace

#define QS_AT_CPU_WIDTH(name, CALL)                    \
  switch (cpu_width()) {                               \
    case Width::avx512: return delta_avx512::name(CALL); \
    case Width::avx2: return delta_avx2::name(CALL);     \
    default: return delta_generic::name(CALL);           \
  }

void gated_delta_decode(QS_DECODE_ARGS) { QS_AT_CPU_WIDTH(decode, QS_DECODE_CALL) }

void gated_delta_conv(QS_CONV_ARGS) { QS_AT_CPU_WIDTH(conv_chunk, QS_CONV_CALL) }

void gated_delta_gate(QS_GATE_ARGS) { QS_AT_CPU_WIDTH(gate_rows, QS_GATE_CALL) }

void unit_lower_solve(QS_SOLVE_ARGS) { QS_AT_CPU_WIDTH(lower_solve, QS_SOLVE_CALL) }

}  // namespace qs
