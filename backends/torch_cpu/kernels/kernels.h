// Entry points of the kernel sources, called by ops.cpp (which checks the tensors).
#pragma once

#include <cstdint>

namespace qs {

// AVX2, on the canonical int4 layout (packed [N, K/2], fp16 scale and zero [N, K/64]).
void q4_matmul_avx2(const float* x, int64_t M, int64_t K, const uint8_t* packed, const uint16_t* scale,
                    const uint16_t* zero, int64_t N, float* y);
void q8_matmul_avx2(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scale, int64_t N, float* y);
void q4_dequant_split_avx2(const uint8_t* packed, const uint16_t* scale, const uint16_t* zero, int64_t N, int64_t K,
                           float* out);
void permute_groups(const float* x, int64_t M, int64_t K, float* xp);

// AVX-512 (with or without VNNI), on the blocked layouts of int4_linear.py: 16 output rows per
// block, so each instruction multiplies 16 rows at once and no row needs a horizontal sum.
void q4b_matmul_avx512(const float* x, int64_t M, int64_t K, const uint8_t* codes, const uint16_t* scale,
                       const uint16_t* zero, int64_t N, float* y, bool vnni);
void q8b_matmul_avx512(const float* x, int64_t M, int64_t K, const int8_t* codes, const float* scale, int64_t N,
                       float* y, bool vnni);
// The same with VNNI and int8 activations per group of 64 (vnni8_avx512.cpp).
void q4b_matmul_vnni8(const float* x, int64_t M, int64_t K, const uint8_t* codes, const uint16_t* scale,
                      const uint16_t* zero, int64_t N, float* y);
void q8b_matmul_vnni8(const float* x, int64_t M, int64_t K, const int8_t* codes, const float* scale, int64_t N,
                      float* y);
// int6 rows with a float16 scale per row and group ([blocks, groups, Q6_GROUP_BYTES] codes, [blocks,
// groups, 16] scales: blocked_layout.block_int6), the tied embedding / lm_head where VNNI runs.
constexpr int64_t Q6_GROUP_BYTES = 768;  // 16 rows x 64 inputs x 6 bits
void q6b_matmul_vnni8(const float* x, int64_t M, int64_t K, const uint8_t* codes, const uint16_t* scale, int64_t N,
                      float* y);
// A mixture-of-experts SwiGLU MLP on blocked int4 experts, VNNI (vnni8_avx512.cpp): out [T, H] =
// sum over j of route[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = chosen[t, j] in [0, E).
// table [E, 6]: the addresses of expert e's gate/up (2I rows, gate first) codes, scale and zero,
// then its down (H rows) codes, scale and zero, kept alive by the caller.
void q4b_moe_vnni8(const float* x, int64_t T, int64_t H, int64_t top_k, const int64_t* chosen, const float* route,
                   const int64_t* table, int64_t E, int64_t I, float* out);
// Blocks [first, stop) of a blocked int4 weight dequantized into a transposed tile out [K, ld], float32
// or bfloat16 (unpack_avx512.cpp): block i's 16 rows are columns 16 * (i - first) onwards.
void q4b_unpack_avx512(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero, int64_t groups,
                       int64_t first, int64_t stop, void* out, int64_t ld, bool bf16);
// The same for blocks [first, stop) of a blocked bfloat16 weight [blocks, K/2, 16, 2] (no rounding).
void bf16b_unpack_avx512(const uint16_t* codes, int64_t K, int64_t first, int64_t stop, void* out, int64_t ld,
                         bool bf16);

// Decode attention over a paged KV cache, read in place through the block tables (AVX-512, AVX2).
// kv_bf16: the caches hold bfloat16 (as uint16), else float32. q [B, H, D] has rows q_stride apart.
void paged_decode_avx512(const float* q, int64_t q_stride, int64_t B, int64_t H, int64_t D, const void* key_cache,
                         const void* value_cache, bool kv_bf16, int64_t Hkv, const int64_t* block_tables,
                         int64_t max_blocks, const int64_t* lengths, int64_t block_size, float scale, float* out);
void paged_decode_avx2(const float* q, int64_t q_stride, int64_t B, int64_t H, int64_t D, const void* key_cache,
                       const void* value_cache, bool kv_bf16, int64_t Hkv, const int64_t* block_tables,
                       int64_t max_blocks, const int64_t* lengths, int64_t block_size, float scale, float* out);

// keys, values [T, n] float32 at row strides of their own into rows slots[t] of float32 or
// bfloat16 caches [slots, n] (kv_write.cpp).
void kv_write(const float* keys, const float* values, int64_t T, int64_t key_stride, int64_t value_stride, int64_t n,
              const int64_t* slots, void* key_cache, void* value_cache, bool bf16);

}  // namespace qs

namespace qs {
// bfloat16 weights [blocks, K/2, 16 rows, 2] times float32 x, float32 y: with dot_bf16 x is rounded
// to bf16 and pairs multiplied by vdpbf16ps (AVX512-BF16), else weights widened to float32 (AVX-512).
void bf16b_matmul_avx512(const float* x, int64_t M, int64_t K, const uint16_t* codes, int64_t N, float* y,
                         bool dot_bf16);
// float32 weights [blocks, K, 16 rows] times float32 x (f32_avx512.cpp): each output summed over
// k in order, the same bits whatever M.
void f32b_matmul_avx512(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y);
void f32b_matmul_avx2(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y);
// The same layout in bfloat16 (f32_avx2.cpp), widened to float32 in registers.
void bf16c_matmul_avx2(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, float* y);

// Fused element-wise steps of a decoder layer (fused.cpp), float32, rows independent; head_norm_rope
// and silu_mul take rows at a stride (the column slices of a merged projection's output).
void rms_norm(const float* x, int64_t T, int64_t H, const float* w, float eps, float* y);
void add_rms_norm(float* hidden, const float* delta, int64_t T, int64_t H, const float* w, float eps, float* y);
void head_norm_rope(float* x, int64_t T, int64_t row_stride, int64_t heads, int64_t D, int64_t R, const float* w,
                    float eps, const float* cos, const float* sin);
void silu_mul(const float* gate, const float* up, int64_t T, int64_t n, int64_t gate_stride, int64_t up_stride,
              float* y);
void sigmoid_mul(float* x, const float* gate, int64_t T, int64_t n, int64_t gate_stride);  // x [T, n] in place
void silu_row(float* x, int64_t n);  // in place, one row (no threads)
// A mixture of experts' routing: per row of logits [T, n], the top_k experts by softmax probability,
// most probable first (ties: the lower index), into chosen [T, top_k], their probabilities into
// weights [T, top_k], renormalized to sum to 1 with normalize.
void route_top_k(const float* logits, int64_t T, int64_t n, int64_t top_k, bool normalize, float* weights,
                 int64_t* chosen);
// out [T, n] += sigmoid(gate[t]) * x [T, n] per row t (gate rows gate_stride apart): a gated shared expert.
void add_sigmoid_gated(float* out, const float* x, const float* gate, int64_t gate_stride, int64_t T, int64_t n);

// One decode step of Gated DeltaNet for B sequences (delta_rule.cpp), float32, the state read and
// written in the backend's storage: mixed [B, C] (rows mixed_stride apart) is in_proj_qkv's output,
// C = 2 Hk dk + Hv dv; its causal convolution reads and shifts conv_state[slots[b]] [taps - 1, C]
// (conv_weight [taps, C], each tap's weights contiguous), then SiLU; q and k are L2-normalized per key head, q scaled by dk^-0.5;
// each value head h (key head h / (Hv / Hk)) updates state[slots[b], h] [dk, dv] by its decay
// exp(decay_rate[h] softplus(a + dt_bias[h])) and write strength sigmoid(b), where gates [B, 2 Hv]
// (rows gates_stride apart) hold a then b, and reads it with q; the reading is RMS-normed
// (norm_weight [dv], eps) and multiplied by SiLU(z[b, h]) (z rows z_stride apart) into out
// [B, Hv dv]. fresh[b]: the sequence starts here, its history and state are zeros. write_slots: null
// to update each state in place, or where sequence b's stepped history and state go instead (its
// slot's left as they were): a drafted chunk's rows step from one kept state into the next.
void gated_delta_decode(const float* mixed, int64_t mixed_stride, const float* z, int64_t z_stride, int64_t B,
                        int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* conv_weight, int64_t taps,
                        float* conv_state, float* state, const int64_t* slots, const int64_t* write_slots,
                        const bool* fresh, const float* gates, int64_t gates_stride, const float* decay_rate,
                        const float* dt_bias, const float* norm_weight, float eps, float* out);
// The same convolution, SiLU and q/k norms for one sequence's prefill chunk: mixed [T, C] (rows
// mixed_stride apart) -> out [T, C]; history [taps - 1, C] holds the inputs before the chunk and
// afterwards the chunk's last ones.
void gated_delta_conv(const float* mixed, int64_t mixed_stride, int64_t T, int64_t Hk, int64_t dk, int64_t C,
                      const float* conv_weight, int64_t taps, float* history, float* out);
// The delta rule's readings out [T, Hv, dv], in place: each head RMS-normed (norm_weight [dv], eps) and
// multiplied by SiLU(z) (z [T, Hv dv], rows z_stride apart), as the decode step ends.
void gated_delta_gate(float* out, const float* z, int64_t z_stride, int64_t T, int64_t Hv, int64_t dv,
                      const float* norm_weight, float eps);
// The chunked delta rule's writes: per head h < H, rhs[h] [n, cols] <- (I + L)^-1 rhs[h] in place,
// L the strictly lower triangle of system[h] [n, n] (its diagonal and upper triangle are not read).
void unit_lower_solve(const float* system, int64_t H, int64_t n, float* rhs, int64_t cols);
}  // namespace qs
