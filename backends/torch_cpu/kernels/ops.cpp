// The kernels as torch operators (torch.ops.qwen_serve.*): tensor checks, then the raw loops.
// They run on torch's own intra-op thread pool (at::parallel_for), so they and torch's ops share
// the same threads and never oversubscribe the cores.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels.h"

namespace {

const uint16_t* half_bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }

void check_activations(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [M, K]");
  TORCH_CHECK(x.size(1) == K && K % 64 == 0, "x has ", x.size(1), " columns, the weight ", K, " (a multiple of 64)");
}

void require(const char* feature, bool supported) {
  TORCH_CHECK(supported, "this CPU lacks ", feature, " for the kernel asked for");
}

at::Tensor q4_matmul_avx2(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                          const at::Tensor& zero) {
  require("avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  const int64_t N = packed.size(0), K = packed.size(1) * 2;
  check_activations(x, K);
  TORCH_CHECK(packed.is_contiguous() && scale.is_contiguous() && zero.is_contiguous(), "weights must be contiguous");
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qs::q4_matmul_avx2(x.data_ptr<float>(), x.size(0), K, packed.data_ptr<uint8_t>(), half_bits(scale), half_bits(zero),
                     N, y.data_ptr<float>());
  return y;
}

at::Tensor q8_matmul_avx2(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale) {
  require("avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  const int64_t N = codes.size(0), K = codes.size(1);
  check_activations(x, K);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qs::q8_matmul_avx2(x.data_ptr<float>(), x.size(0), K, codes.data_ptr<int8_t>(), scale.data_ptr<float>(), N,
                     y.data_ptr<float>());
  return y;
}

void q4_dequant_split_avx2(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& zero, at::Tensor out) {
  require("avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat && out.size(0) == packed.size(0) &&
                  out.size(1) == packed.size(1) * 2, "out must be contiguous float32 [rows, K]");
  qs::q4_dequant_split_avx2(packed.data_ptr<uint8_t>(), half_bits(scale), half_bits(zero), packed.size(0), out.size(1),
                            out.data_ptr<float>());
}

at::Tensor permute_groups(const at::Tensor& x) {
  check_activations(x, x.size(1));
  at::Tensor xp = at::empty_like(x);
  qs::permute_groups(x.data_ptr<float>(), x.size(0), x.size(1), xp.data_ptr<float>());
  return xp;
}

void require_q4b(bool vnni) {
  require("avx512bw", __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"));
  if (vnni) require("avx512vnni", __builtin_cpu_supports("avx512vnni"));
}

// The blocked int4 layout of N output rows; returns K.
int64_t check_q4b_weight(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& zero, int64_t N) {
  // codes [blocks, groups, 16, 16, 2] uint8; scale, zero [blocks, groups, 16] float16
  TORCH_CHECK(codes.dim() == 5 && codes.size(2) == 16 && codes.size(3) == 16 && codes.is_contiguous() &&
                  codes.scalar_type() == at::kByte, "codes must be the contiguous blocked int4 layout");
  TORCH_CHECK(codes.size(0) == (N + 15) / 16 && scale.numel() == codes.size(0) * codes.size(1) * 16 &&
                  zero.numel() == scale.numel() && scale.is_contiguous() && zero.is_contiguous() &&
                  scale.element_size() == 2 && zero.element_size() == 2,
              "N does not match the blocks");
  return codes.size(1) * 64;
}

at::Tensor q4b_matmul_avx512(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                             const at::Tensor& zero, int64_t N, bool vnni) {
  require_q4b(vnni);
  const int64_t K = check_q4b_weight(codes, scale, zero, N);
  check_activations(x, K);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qs::q4b_matmul_avx512(x.data_ptr<float>(), x.size(0), K, codes.data_ptr<uint8_t>(), half_bits(scale),
                        half_bits(zero), N, y.data_ptr<float>(), vnni);
  return y;
}

// Blocks [first, stop) of the blocked int4 layout into out [K, >= 16 * (stop - first)] (float32 or
// bfloat16, rows contiguous): the transposed prefill tile.
void q4b_unpack_avx512_(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& zero, int64_t first,
                        int64_t stop, at::Tensor out) {
  require_q4b(false);
  const int64_t K = check_q4b_weight(codes, scale, zero, codes.size(0) * 16);
  TORCH_CHECK(0 <= first && first <= stop && stop <= codes.size(0), "blocks [", first, ", ", stop, ") out of range");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == K && out.size(1) >= 16 * (stop - first) && out.stride(1) == 1 &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "out must be float32 or bfloat16 [K, 16 * blocks] with contiguous rows");
  qs::q4b_unpack_avx512(codes.data_ptr<uint8_t>(), half_bits(scale), half_bits(zero), codes.size(1), first, stop,
                        out.data_ptr(), out.stride(0), out.scalar_type() == at::kBFloat16);
}

at::Tensor q8b_matmul_avx512(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, int64_t N,
                             bool vnni) {
  require("avx512bw", __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"));
  if (vnni) require("avx512vnni", __builtin_cpu_supports("avx512vnni"));
  // codes [blocks, K/2, 16, 2] int8; scale [blocks * 16] float32
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == 16 && codes.is_contiguous() && codes.size(0) == (N + 15) / 16 &&
                  scale.numel() == codes.size(0) * 16, "codes must be the contiguous blocked int8 layout");
  const int64_t K = codes.size(1) * 2;
  check_activations(x, K);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qs::q8b_matmul_avx512(x.data_ptr<float>(), x.size(0), K, codes.data_ptr<int8_t>(), scale.data_ptr<float>(), N,
                        y.data_ptr<float>(), vnni);
  return y;
}

at::Tensor q6b_matmul_vnni8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, int64_t N) {
  require_q4b(true);
  // codes [blocks, groups, Q6_GROUP_BYTES] uint8; scale [blocks, groups, 16] float16
  TORCH_CHECK(codes.dim() == 3 && codes.size(2) == qs::Q6_GROUP_BYTES && codes.is_contiguous() && codes.scalar_type() == at::kByte &&
                  codes.size(0) == (N + 15) / 16 && scale.is_contiguous() && scale.element_size() == 2 &&
                  scale.numel() == codes.size(0) * codes.size(1) * 16,
              "codes must be the contiguous blocked int6 layout");
  const int64_t K = codes.size(1) * 64;
  check_activations(x, K);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qs::q6b_matmul_vnni8(x.data_ptr<float>(), x.size(0), K, codes.data_ptr<uint8_t>(), half_bits(scale), N,
                       y.data_ptr<float>());
  return y;
}

void require_bf16b(bool dot_bf16) {
  require("avx512bw", __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"));
  if (dot_bf16) require("avx512bf16", __builtin_cpu_supports("avx512bf16"));
}

// The blocked bfloat16 layout of N output rows; returns K.
int64_t check_bf16b_weight(const at::Tensor& codes, int64_t N) {
  // codes [blocks, K/2, 16, 2] bfloat16
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == 16 && codes.size(3) == 2 && codes.is_contiguous() &&
                  codes.scalar_type() == at::kBFloat16 && codes.size(0) == (N + 15) / 16,
              "codes must be the contiguous blocked bfloat16 layout");
  return codes.size(1) * 2;
}

at::Tensor bf16b_matmul_avx512(const at::Tensor& x, const at::Tensor& codes, int64_t N, bool dot_bf16) {
  require_bf16b(dot_bf16);
  const int64_t K = check_bf16b_weight(codes, N);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) == K,
              "x must be contiguous float32 [M, K]");
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qs::bf16b_matmul_avx512(x.data_ptr<float>(), x.size(0), K, reinterpret_cast<const uint16_t*>(codes.data_ptr()), N,
                          y.data_ptr<float>(), dot_bf16);
  return y;
}

// float32 weights [blocks, K, 16] (f32_avx512.cpp, f32_avx2.cpp).
// W: float (float32 weights) or uint16_t (their bfloat16 bits).
// w [blocks, K, 16] of N rows in dtype, checked -> K.
int64_t check_column_blocks(const at::Tensor& w, int64_t N, at::ScalarType dtype) {
  TORCH_CHECK(w.dim() == 3 && w.size(2) == 16 && w.is_contiguous() && w.scalar_type() == dtype &&
                  w.size(0) == (N + 15) / 16, "w must be the contiguous blocked ", dtype, " layout");
  return w.size(1);
}

template <typename W>
at::Tensor f32b_matmul(const at::Tensor& x, const at::Tensor& w, int64_t N,
                       void (*kernel)(const float*, int64_t, int64_t, const W*, int64_t, float*)) {
  const int64_t K = check_column_blocks(w, N, std::is_same_v<W, float> ? at::kFloat : at::kBFloat16);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) == K,
              "x must be contiguous float32 [M, K]");
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  kernel(x.data_ptr<float>(), x.size(0), K, static_cast<const W*>(w.data_ptr()), N, y.data_ptr<float>());
  return y;
}

at::Tensor f32b_matmul_avx512(const at::Tensor& x, const at::Tensor& w, int64_t N) {
  require("avx512f", __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"));
  return f32b_matmul(x, w, N, qs::f32b_matmul_avx512);
}

at::Tensor f32b_matmul_avx2(const at::Tensor& x, const at::Tensor& w, int64_t N) {
  require("avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  return f32b_matmul(x, w, N, qs::f32b_matmul_avx2);
}

at::Tensor bf16c_matmul_avx2(const at::Tensor& x, const at::Tensor& w, int64_t N) {
  require("avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  return f32b_matmul(x, w, N, qs::bf16c_matmul_avx2);
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() >= 1, name, " must be contiguous float32");
}

// Rows at a stride of their own, each row's elements contiguous and no two rows overlapping: a
// column slice of a [T, n] matrix (viewed as [T, n] or [T, heads, D]).
void check_strided_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 2, name, " must be float32 rows");
  int64_t row = 1;
  for (int64_t d = x.dim() - 1; d >= 1; d--) {
    TORCH_CHECK(x.size(d) == 1 || x.stride(d) == row, name, "'s rows must each be contiguous");
    row *= x.size(d);
  }
  TORCH_CHECK(x.size(0) <= 1 || x.stride(0) >= row, name, "'s rows must not overlap");
}

// One layer of the backend's KV storage: contiguous [slots, kv heads, D], float32 or bfloat16.
// Returns whether it is bfloat16.
bool check_caches(const at::Tensor& key_cache, const at::Tensor& value_cache) {
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.sizes() == value_cache.sizes() && key_cache.is_contiguous() &&
                  value_cache.is_contiguous() && key_cache.scalar_type() == value_cache.scalar_type(),
              "caches must be contiguous [slots, kv heads, D] of one dtype");
  const bool bf16 = key_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || key_cache.scalar_type() == at::kFloat, "caches must be float32 or bfloat16");
  return bf16;
}

// B sequences' block tables [B, max_blocks] and lengths [B] (int64) over a cache of `slots` slots:
// a bad table must be an error, never a read out of bounds.
void check_block_tables(const at::Tensor& block_tables, const at::Tensor& lengths, int64_t B, int64_t block_size,
                        int64_t slots) {
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B && block_tables.scalar_type() == at::kLong &&
                  block_tables.is_contiguous() && lengths.numel() == B && lengths.scalar_type() == at::kLong &&
                  lengths.is_contiguous(),
              "block_tables must be int64 [B, max_blocks] and lengths int64 [B]");
  const int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t* table = block_tables.data_ptr<int64_t>();
  const int64_t max_blocks = block_tables.size(1);
  for (int64_t b = 0; b < B; b++) {
    TORCH_CHECK(len[b] > 0 && len[b] <= max_blocks * block_size, "sequence ", b, " has length ", len[b]);
    for (int64_t i = 0; i < (len[b] + block_size - 1) / block_size; i++)
      TORCH_CHECK(table[b * max_blocks + i] >= 0 && (table[b * max_blocks + i] + 1) * block_size <= slots,
                  "block ", table[b * max_blocks + i], " is outside the cache");
  }
}

void check_slots(const at::Tensor& slots, int64_t T, int64_t capacity) {
  TORCH_CHECK(slots.dim() == 1 && slots.numel() == T && slots.scalar_type() == at::kLong && slots.is_contiguous(),
              "slots must be int64 [T]");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; t++)
    TORCH_CHECK(slot[t] >= 0 && slot[t] < capacity, "slot ", slot[t], " is outside the cache");
}

using PagedDecodeKernel = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, const void*, const void*, bool,
                                   int64_t, const int64_t*, int64_t, const int64_t*, int64_t, float, float*);

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                        const at::Tensor& block_tables, const at::Tensor& lengths, int64_t block_size, double scale,
                        PagedDecodeKernel kernel) {
  check_strided_rows(q, "q");  // the q columns of the merged q/k/v output do
  TORCH_CHECK(q.dim() == 3, "q must be [B, H, D]");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const bool bf16 = check_caches(key_cache, value_cache);
  const int64_t Hkv = key_cache.size(1);
  TORCH_CHECK(key_cache.size(2) == D && D % 16 == 0 && H % Hkv == 0, "head sizes do not fit (D a multiple of 16)");
  check_block_tables(block_tables, lengths, B, block_size, key_cache.size(0));
  at::Tensor out = at::empty({B, H, D}, q.options());
  kernel(q.data_ptr<float>(), q.stride(0), B, H, D, key_cache.data_ptr(), value_cache.data_ptr(), bf16, Hkv,
         block_tables.data_ptr<int64_t>(), block_tables.size(1), lengths.data_ptr<int64_t>(), block_size,
         static_cast<float>(scale), out.data_ptr<float>());
  return out;
}

at::Tensor paged_decode_avx512(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                               const at::Tensor& block_tables, const at::Tensor& lengths, int64_t block_size,
                               double scale) {
  require("avx512f", __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"));
  return paged_decode(q, key_cache, value_cache, block_tables, lengths, block_size, scale, qs::paged_decode_avx512);
}

at::Tensor paged_decode_avx2(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                             const at::Tensor& block_tables, const at::Tensor& lengths, int64_t block_size,
                             double scale) {
  require("avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  return paged_decode(q, key_cache, value_cache, block_tables, lengths, block_size, scale, qs::paged_decode_avx2);
}

// keys, values [T, Hkv, D] float32 (rows at a stride) into slots [T] of caches [slots, Hkv, D].
void kv_write_(at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& slots, const at::Tensor& keys,
               const at::Tensor& values) {
  check_strided_rows(keys, "keys");
  check_strided_rows(values, "values");
  const bool bf16 = check_caches(key_cache, value_cache);
  const int64_t T = keys.size(0), n = key_cache.size(1) * key_cache.size(2);
  TORCH_CHECK(keys.sizes() == values.sizes() && keys.numel() == T * n, "keys and values must be [T, kv heads, D] as the cache");
  check_slots(slots, T, key_cache.size(0));
  qs::kv_write(keys.data_ptr<float>(), values.data_ptr<float>(), T, keys.stride(0), values.stride(0), n,
               slots.data_ptr<int64_t>(), key_cache.data_ptr(), value_cache.data_ptr(), bf16);
}

void check_weight(const at::Tensor& w, int64_t n) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() == n, "the norm weight must be float32 [",
              n, "]");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  const int64_t H = x.size(-1);
  check_weight(weight, H);
  at::Tensor y = at::empty_like(x);
  qs::rms_norm(x.data_ptr<float>(), x.numel() / H, H, weight.data_ptr<float>(), static_cast<float>(eps),
               y.data_ptr<float>());
  return y;
}

at::Tensor add_rms_norm_(at::Tensor hidden, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  check_rows(hidden, "hidden");
  check_rows(delta, "delta");
  TORCH_CHECK(hidden.sizes() == delta.sizes(), "hidden and delta differ in shape");
  const int64_t H = hidden.size(-1);
  check_weight(weight, H);
  at::Tensor y = at::empty_like(hidden);
  qs::add_rms_norm(hidden.data_ptr<float>(), delta.data_ptr<float>(), hidden.numel() / H, H, weight.data_ptr<float>(),
                   static_cast<float>(eps), y.data_ptr<float>());
  return y;
}

void head_norm_rope_(at::Tensor x, const c10::optional<at::Tensor>& weight, double eps, const at::Tensor& cos,
                     const at::Tensor& sin) {
  check_strided_rows(x, "x");
  TORCH_CHECK(x.dim() == 3, "x must be [T, heads, D]");
  const int64_t T = x.size(0), heads = x.size(1), D = x.size(2), R = cos.dim() == 2 ? cos.size(1) : 0;
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(R > 0 && R % 2 == 0 && R <= D, "the rotary width ", R, " must be even and at most the head size ", D);
  TORCH_CHECK(cos.numel() == T * R && sin.sizes() == cos.sizes(), "cos and sin must be [T, rotary width]");
  const float* w = nullptr;
  if (weight.has_value()) {
    check_weight(*weight, D);
    w = weight->data_ptr<float>();
  }
  qs::head_norm_rope(x.data_ptr<float>(), T, x.stride(0), heads, D, R, w, static_cast<float>(eps),
                     cos.data_ptr<float>(), sin.data_ptr<float>());
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_strided_rows(gate, "gate");
  check_strided_rows(up, "up");
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes(), "gate and up must be [T, n] alike");
  at::Tensor y = at::empty(gate.sizes(), gate.options());
  qs::silu_mul(gate.data_ptr<float>(), up.data_ptr<float>(), gate.size(0), gate.size(1), gate.stride(0), up.stride(0),
               y.data_ptr<float>());
  return y;
}

// x [T, n] contiguous, in place: x * sigmoid(gate), gate [T, n] rows at a stride (the gate's
// columns of a merged projection's output): gated attention's output gate.
void sigmoid_mul_(at::Tensor x, const at::Tensor& gate) {
  check_rows(x, "x");
  check_strided_rows(gate, "gate");
  TORCH_CHECK(x.dim() == 2 && gate.sizes() == x.sizes(), "x and gate must be [T, n] alike");
  qs::sigmoid_mul(x.data_ptr<float>(), gate.data_ptr<float>(), x.size(0), x.size(1), gate.stride(0));
}

// A mixture-of-experts MLP over blocked int4 experts (kernels.h): x [T, H]; chosen int64 and
// route float32 [T, top_k]; table int64 [E, 6] of the experts' tensor addresses (the caller built
// it from tensors it checked and keeps alive); inter: each expert's intermediate width.
at::Tensor q4b_moe_vnni8(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& route,
                         const at::Tensor& table, int64_t inter) {
  require_q4b(true);
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 64 == 0 && inter > 0 && inter % 64 == 0,
              "x must be [T, H] and the widths multiples of 64");
  const int64_t T = x.size(0), top_k = chosen.dim() == 2 ? chosen.size(1) : 0;
  TORCH_CHECK(chosen.dim() == 2 && chosen.size(0) == T && top_k > 0 && chosen.scalar_type() == at::kLong &&
                  chosen.is_contiguous(), "chosen must be int64 [T, top_k]");
  TORCH_CHECK(route.sizes() == chosen.sizes() && route.scalar_type() == at::kFloat && route.is_contiguous(),
              "route must be float32 [T, top_k]");
  TORCH_CHECK(table.dim() == 2 && table.size(1) == 6 && table.scalar_type() == at::kLong && table.is_contiguous(),
              "table must be int64 [experts, 6]");
  const int64_t E = table.size(0);
  const int64_t* expert = chosen.data_ptr<int64_t>();
  for (int64_t p = 0; p < T * top_k; p++)
    TORCH_CHECK(expert[p] >= 0 && expert[p] < E, "expert ", expert[p], " is not one of the ", E);
  at::Tensor out = at::empty({T, x.size(1)}, x.options());
  qs::q4b_moe_vnni8(x.data_ptr<float>(), T, x.size(1), top_k, expert, route.data_ptr<float>(),
                    table.data_ptr<int64_t>(), E, inter, out.data_ptr<float>());
  return out;
}

// A mixture of experts' routing (kernels.h): logits [T, n] float32 -> (weights float32, chosen int64) [T, top_k].
std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, int64_t top_k, bool normalize) {
  check_rows(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && top_k > 0 && top_k <= logits.size(1), "logits must be [T, n] with top_k <= n");
  const int64_t T = logits.size(0);
  at::Tensor weights = at::empty({T, top_k}, logits.options());
  at::Tensor chosen = at::empty({T, top_k}, logits.options().dtype(at::kLong));
  qs::route_top_k(logits.data_ptr<float>(), T, logits.size(1), top_k, normalize, weights.data_ptr<float>(),
                  chosen.data_ptr<int64_t>());
  return {weights, chosen};
}

// out [T, n] += sigmoid(gate) * x, gate [T, 1] (rows at a stride of their own), all float32.
void add_sigmoid_gated_(at::Tensor out, const at::Tensor& x, const at::Tensor& gate) {
  check_rows(out, "out");
  check_rows(x, "x");
  check_strided_rows(gate, "gate");
  TORCH_CHECK(out.dim() == 2 && x.sizes() == out.sizes() && gate.dim() == 2 && gate.size(0) == out.size(0) &&
                  gate.size(1) == 1, "out and x must be [T, n] alike and gate [T, 1]");
  qs::add_sigmoid_gated(out.data_ptr<float>(), x.data_ptr<float>(), gate.data_ptr<float>(), gate.stride(0),
                        out.size(0), out.size(1));
}

// Gated DeltaNet's per-layer tensors as gated_delta_decode takes them (kernels.h), checked:
// conv_weight [taps, C], conv_state [S, taps - 1, C], state [S, Hv, dk, dv], decay_rate and
// dt_bias [Hv], norm_weight [dv], all contiguous float32, C = 2 key_heads dk + Hv dv.
struct DeltaShape {
  int64_t slots, key_heads, value_heads, key_dim, value_dim, channels, taps;
};

DeltaShape check_delta(const at::Tensor& conv_weight, const at::Tensor& conv_state, const at::Tensor& state,
                       const at::Tensor& decay_rate, const at::Tensor& dt_bias, const at::Tensor& norm_weight,
                       int64_t key_heads) {
  check_rows(conv_weight, "conv_weight");
  check_rows(conv_state, "conv_state");
  check_rows(state, "state");
  check_rows(decay_rate, "decay_rate");
  check_rows(dt_bias, "dt_bias");
  check_rows(norm_weight, "norm_weight");
  TORCH_CHECK(state.dim() == 4 && conv_state.dim() == 3 && conv_weight.dim() == 2, "state [S, Hv, dk, dv], "
              "conv_state [S, taps - 1, C] and conv_weight [taps, C] expected");
  const int64_t S = state.size(0), Hv = state.size(1), dk = state.size(2), dv = state.size(3);
  const int64_t C = 2 * key_heads * dk + Hv * dv, taps = conv_weight.size(0);
  TORCH_CHECK(key_heads > 0 && Hv % key_heads == 0 && dv <= 512, "value heads must share key heads evenly, dv <= 512");
  TORCH_CHECK(conv_weight.size(1) == C, "conv_weight must have ", C, " channels");
  TORCH_CHECK(conv_state.size(0) == S && conv_state.size(1) == taps - 1 && conv_state.size(2) == C,
              "conv_state must be [", S, ", ", taps - 1, ", ", C, "]");
  TORCH_CHECK(decay_rate.numel() == Hv && dt_bias.numel() == Hv, "decay_rate and dt_bias must have Hv elements");
  TORCH_CHECK(norm_weight.numel() == dv, "norm_weight must have dv elements");
  return {S, key_heads, Hv, dk, dv, C, taps};
}

// B sequences' state slots (int64) and whether each starts at zeros (bool), among S slots.
void check_state_slots(const at::Tensor& slots, const at::Tensor& fresh, int64_t B, int64_t S) {
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == B &&
                  fresh.scalar_type() == at::kBool && fresh.is_contiguous() && fresh.numel() == B,
              "slots must be int64 [B] and fresh bool [B]");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; b++) TORCH_CHECK(slot[b] >= 0 && slot[b] < S, "slot ", slot[b], " is not one of ", S);
}

// The order in which a step's T rows update their states (decode_layers_): steps whose rows are
// distinct, in [0, T), each in one step, a state slot per row (state_slots in that order; that a
// step's rows touch distinct slots, plan_states checks); copies [P, 2] of slots among S. Returns the
// number of steps (0 when step_starts is empty: one step in row order, nothing copied).
int64_t check_steps(const at::Tensor& step_rows, const at::Tensor& step_starts, const at::Tensor& copies,
                    const at::Tensor& copy_starts, const at::Tensor& state_slots, int64_t T, int64_t S) {
  if (step_starts.numel() == 0) {
    TORCH_CHECK(step_rows.numel() == 0 && copies.numel() == 0 && copy_starts.numel() == 0,
                "without step_starts, step_rows, copies and copy_starts must be empty");
    return 0;
  }
  for (const at::Tensor* t : {&step_rows, &step_starts, &copies, &copy_starts})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "step_rows, step_starts, copies and "
                "copy_starts must be contiguous int64");
  const int64_t steps = step_starts.numel() - 1;
  TORCH_CHECK(step_rows.numel() == T && copy_starts.numel() == steps + 1 && copies.dim() == 2 && copies.size(1) == 2,
              "step_rows must be [T], copy_starts [steps + 1] and copies [P, 2]");
  const int64_t *order = step_rows.data_ptr<int64_t>(), *start = step_starts.data_ptr<int64_t>();
  const int64_t *copy_start = copy_starts.data_ptr<int64_t>(), *pairs = copies.data_ptr<int64_t>();
  TORCH_CHECK(start[0] == 0 && start[steps] == T && copy_start[0] == 0 && copy_start[steps] == copies.size(0),
              "step_starts must run from 0 to T and copy_starts from 0 to P");
  TORCH_CHECK(state_slots.numel() == T, "steps need a state slot per row (Gated DeltaNet layers)");
  std::vector<char> seen(T, 0);
  for (int64_t s = 0; s < steps; s++) {
    TORCH_CHECK(start[s] < start[s + 1] && copy_start[s] <= copy_start[s + 1], "steps must be non-empty, in order");
    for (int64_t j = start[s]; j < start[s + 1]; j++) {
      TORCH_CHECK(order[j] >= 0 && order[j] < T && !seen[order[j]], "step_rows must hold each row once");
      seen[order[j]] = 1;
    }
  }
  for (int64_t p = 0; p < 2 * copies.size(0); p++)
    TORCH_CHECK(pairs[p] >= 0 && pairs[p] < S, "copied slot ", pairs[p], " is not one of ", S);
  return steps;
}

// How a step's rows (check_steps' stepping order) move their states: row j reads slot read[j] and
// writes slot write[j], and after step s the states copied[s] (from, to) are copied. A chunk's state
// lives in its own slot (state_slots[j] for each of its rows); where a row is followed by a copy of
// it (the state a rewind returns to, or a prefix-cache snapshot) and by another row of the chunk, the
// row writes straight into the copy's slot and the next row steps on from there, so the copy is not
// made (a megabyte a draft per layer for Qwen3.5-0.8B); a chunk's last row writes into its own slot.
// Every slot ends as stepping in place and copying after each step leaves it (the chunk's own slot
// holds its old state until its last row, which nothing reads), given that no copy goes into a
// stepping chunk's own slot: checked.
struct StatePlan {
  std::vector<int64_t> read, write;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> copied;
};

StatePlan plan_states(int64_t steps, const int64_t* start, const int64_t* state_slots, const int64_t* pairs,
                      const int64_t* copy_start, int64_t T) {
  StatePlan plan{std::vector<int64_t>(T), std::vector<int64_t>(T), {}};
  plan.copied.resize(steps);
  std::map<int64_t, int64_t> last_step, current;  // by a chunk's own slot
  for (int64_t s = 0; s < steps; s++)
    for (int64_t j = start[s]; j < start[s + 1]; j++) last_step[state_slots[j]] = s;
  for (int64_t p = 0; p < copy_start[steps]; p++)
    TORCH_CHECK(!last_step.count(pairs[2 * p + 1]), "a copy goes into slot ", pairs[2 * p + 1],
                ", a stepping chunk's own");
  std::vector<std::pair<int64_t, int64_t>> touched;  // (slot, row) read or written in a step
  for (int64_t s = 0; s < steps; s++) {
    std::vector<char> used(copy_start[s + 1] - copy_start[s], 0);
    touched.clear();
    for (int64_t j = start[s]; j < start[s + 1]; j++) {
      const int64_t own = state_slots[j];
      const auto found = current.find(own);
      plan.read[j] = found == current.end() ? own : found->second;
      std::vector<int64_t> targets;
      for (int64_t p = copy_start[s]; p < copy_start[s + 1]; p++)
        if (pairs[2 * p] == own) {
          if (std::find(targets.begin(), targets.end(), pairs[2 * p + 1]) == targets.end())
            targets.push_back(pairs[2 * p + 1]);
          used[p - copy_start[s]] = 1;
        }
      const bool direct = !targets.empty() && s < last_step[own];
      plan.write[j] = current[own] = direct ? targets[0] : own;
      for (size_t t = direct ? 1 : 0; t < targets.size(); t++) plan.copied[s].emplace_back(plan.write[j], targets[t]);
      touched.emplace_back(plan.read[j], j);
      if (plan.write[j] != plan.read[j]) touched.emplace_back(plan.write[j], j);
    }
    std::sort(touched.begin(), touched.end());
    for (size_t i = 1; i < touched.size(); i++)  // the kernel steps a step's rows in parallel
      TORCH_CHECK(touched[i].first != touched[i - 1].first || touched[i].second == touched[i - 1].second,
                  "the rows of step ", s, " share a state slot");
    for (int64_t p = copy_start[s]; p < copy_start[s + 1]; p++)
      TORCH_CHECK(used[p - copy_start[s]], "a copy after step ", s, " is of slot ", pairs[2 * p],
                  ", no chunk stepping there");
  }
  return plan;
}

// Every decoder layer of a step without prefill chunks in one call, for projections on the blocked int4 or
// bfloat16 layouts, the backend's own paged KV storage and (for linear-attention layers) its own
// state storage: the configuration of decode. The same kernels in the same order as the per-op
// path of model.py, so the result is the same to the bit; what goes is the Python and the
// dispatch around ~11 calls per layer (about a seventh of a single-stream Qwen3-0.6B step, and
// ~15% of a Qwen3.5-0.8B one, py-spy). Layer l holds, in order, in weights:
//   input_norm, its mixer's tensors (mixers[l]), its MLP's tensors (mlps[l])
// where an MLP is
//   DENSE: post_norm, gate_up codes/scale/zero, down codes/scale/zero
//   EXPERTS: post_norm, the router (float32 blocked [blocks, E, 16] of n experts' rows), the experts'
//     table (int64 [n, 6]: q4b_moe_vnni8's addresses of the experts' tensors, which the caller keeps
//     alive and built the table from when they last moved), a
//     shared expert's gate_up codes/scale/zero and down codes/scale/zero and its gate (float32
//     blocked, one row), all seven empty without one; each row runs its top_k experts by softmax
//     probability (normalize: their weights renormalized), each of expert_inter intermediate width
// and a mixer is
//   ATTENTION: qkv codes/scale/zero (q, k, v, then with output_gate the gate's columns), q_norm, k_norm,
//     o codes/scale/zero; the i-th attention layer reads and writes key_caches[i], value_caches[i]
//   GATED_DELTA: in_proj codes/scale/zero (the mixed channels, then z), gates (float32 blocked
//     [blocks, E, 16]: a, then b), conv_by_tap, decay_rate, dt_bias, out_norm, out_proj codes/scale/zero;
//     the i-th such layer updates conv_states[i], states[i] at each row's state slot (fresh: it
//     starts at zeros), row after row where a chunk has more (its drafts): the rows
//     step_rows[step_starts[s] .. step_starts[s + 1]) step together, one row of each chunk,
//     s = 0, 1, ..., and state_slots and fresh follow step_rows' order; after step s, state slot copies[p][0] is copied into copies[p][1] for p in
//     [copy_starts[s], copy_starts[s + 1]) (the states a rewind returns to; plan_states makes most of these
//     copies unneeded). Empty step_starts:
//     every row is its own chunk, one step in row order, nothing copied (decode)
// (q_norm, k_norm: empty tensors for a model without them; a bfloat16 projection's scale and zero
// are empty too). cos and sin [T, R] turn each head's first R of head_dim dimensions. hidden [T, E]
// is the residual stream, x = rms_norm(hidden) by the first layer's input norm; on return hidden
// holds the residual before the last layer's MLP, which is returned (model.py adds it for sampled rows).
constexpr int64_t ATTENTION = 0, GATED_DELTA = 1;
constexpr int64_t MIXER_TENSORS[] = {8, 11};
constexpr int64_t DENSE = 0, EXPERTS = 1;
constexpr int64_t MLP_TENSORS[] = {7, 10};

at::Tensor decode_layers_(at::Tensor hidden, const at::Tensor& x0, at::IntArrayRef mixers, at::IntArrayRef mlps,
                          at::TensorList weights,
                          at::TensorList key_caches, at::TensorList value_caches, at::TensorList conv_states,
                          at::TensorList states, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                          const at::Tensor& block_tables, const at::Tensor& lengths, const at::Tensor& state_slots,
                          const at::Tensor& fresh, const at::Tensor& step_rows, const at::Tensor& step_starts,
                          const at::Tensor& copies, const at::Tensor& copy_starts, int64_t block_size, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, bool output_gate, int64_t key_heads, int64_t top_k,
                          bool normalize, int64_t expert_inter, double eps, double scale, bool vnni, bool dot_bf16) {
  require("avx512f", __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"));
  const int64_t L = static_cast<int64_t>(mixers.size());
  TORCH_CHECK(static_cast<int64_t>(mlps.size()) == L, "one MLP kind per layer");
  int64_t attention_layers = 0, delta_layers = 0, expected = 0;
  for (int64_t l = 0; l < L; l++) {
    TORCH_CHECK(mixers[l] == ATTENTION || mixers[l] == GATED_DELTA, "mixer kind ", mixers[l],
                " is not 0 (attention) or 1 (Gated DeltaNet)");
    TORCH_CHECK(mlps[l] == DENSE || mlps[l] == EXPERTS, "MLP kind ", mlps[l], " is not 0 (dense) or 1 (experts)");
    (mixers[l] == ATTENTION ? attention_layers : delta_layers)++;
    expected += 1 + MIXER_TENSORS[mixers[l]] + MLP_TENSORS[mlps[l]];
  }
  TORCH_CHECK(L > 0 && static_cast<int64_t>(weights.size()) == expected, "weights must hold ", expected,
              " tensors for these layers");
  TORCH_CHECK(static_cast<int64_t>(key_caches.size()) == attention_layers && value_caches.size() == key_caches.size(),
              "one key and value cache per attention layer");
  TORCH_CHECK(static_cast<int64_t>(states.size()) == delta_layers && conv_states.size() == states.size(),
              "one convolution and recurrent state per Gated DeltaNet layer");
  check_rows(hidden, "hidden");
  check_rows(x0, "x");
  TORCH_CHECK(hidden.dim() == 2 && x0.sizes() == hidden.sizes(), "hidden and x must be [T, E] alike");
  const int64_t T = hidden.size(0), E = hidden.size(1), D = head_dim;
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  const int64_t R = cos.size(-1);
  TORCH_CHECK(cos.numel() == T * R && sin.sizes() == cos.sizes() && R % 2 == 0 && R <= D && D % 16 == 0,
              "cos and sin must be [T, R], R even and at most head_dim, a multiple of 16");
  TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of kv heads");
  const int64_t n_q = heads * D, n_kv = kv_heads * D, n_qkv = n_q + 2 * n_kv + (output_gate ? n_q : 0);
  // The input width of a projection (int4 or bfloat16 blocks) of N outputs, checked.
  auto input_width = [&](const at::Tensor* w, int64_t N) {
    if (w[0].scalar_type() == at::kBFloat16) {
      require_bf16b(dot_bf16);
      return check_bf16b_weight(w[0], N);
    }
    require_q4b(vnni);
    return check_q4b_weight(w[0], w[1], w[2], N);
  };
  DeltaShape delta{};
  int64_t inter = -1, shared_inter = -1, experts = 0, offset = 0, delta_index = 0;
  for (int64_t l = 0; l < L; l++) {
    const at::Tensor* w = weights.data() + offset;  // input_norm, then the mixer's
    const at::Tensor* m = w + 1 + MIXER_TENSORS[mixers[l]];  // post_norm, gate_up, down
    check_weight(w[0], E);
    if (mixers[l] == ATTENTION) {
      TORCH_CHECK(input_width(w + 1, n_qkv) == E, "layer ", l, ": q/k/v weights do not fit");
      TORCH_CHECK(w[4].numel() == 0 || w[4].numel() == D, "layer ", l, ": q_norm must be [D] or empty");
      TORCH_CHECK(w[5].numel() == w[4].numel(), "layer ", l, ": k_norm must be as q_norm");
      if (w[4].numel()) check_weight(w[4], D), check_weight(w[5], D);
      TORCH_CHECK(input_width(w + 6, E) == n_q, "layer ", l, ": o_proj does not fit");
    } else {
      const int64_t i = delta_index++;
      const DeltaShape shape = check_delta(w[5], conv_states[i], states[i], w[6], w[7], w[8], key_heads);
      TORCH_CHECK(i == 0 || (shape.slots == delta.slots && shape.value_heads == delta.value_heads &&
                             shape.key_dim == delta.key_dim && shape.value_dim == delta.value_dim &&
                             shape.taps == delta.taps),
                  "layer ", l, ": every Gated DeltaNet layer must have the first one's geometry");
      delta = shape;
      const int64_t value_width = delta.value_heads * delta.value_dim;
      TORCH_CHECK(input_width(w + 1, delta.channels + value_width) == E, "layer ", l, ": in_proj does not fit");
      TORCH_CHECK(check_column_blocks(w[4], 2 * delta.value_heads, at::kFloat) == E, "layer ", l,
                  ": the gates must be float32 blocked [blocks, E, 16] of 2 Hv rows");
      TORCH_CHECK(input_width(w + 9, E) == value_width, "layer ", l, ": out_proj does not fit");
    }
    check_weight(m[0], E);
    if (mlps[l] == DENSE) {
      if (inter < 0) inter = input_width(m + 4, E);  // the first down projection's
      TORCH_CHECK(input_width(m + 1, 2 * inter) == E, "layer ", l, ": gate/up do not fit");
      TORCH_CHECK(input_width(m + 4, E) == inter, "layer ", l, ": down_proj does not fit");
    } else {
      require_q4b(vnni);  // the experts' kernel
      TORCH_CHECK(vnni, "the experts' kernel needs AVX-512 VNNI");
      const at::Tensor& table = m[2];
      TORCH_CHECK(table.dim() == 2 && table.size(1) == 6 && table.scalar_type() == at::kLong && table.is_contiguous(),
                  "layer ", l, ": the experts' table must be int64 [experts, 6]");
      TORCH_CHECK(experts == 0 || table.size(0) == experts, "layer ", l, ": every layer must have the first's experts");
      experts = table.size(0);
      TORCH_CHECK(top_k > 0 && top_k <= experts && expert_inter > 0 && expert_inter % 64 == 0 && E % 64 == 0,
                  "top_k must be in [1, experts] and the experts' widths multiples of 64");
      TORCH_CHECK(check_column_blocks(m[1], experts, at::kFloat) == E, "layer ", l,
                  ": the router must be float32 blocked [blocks, E, 16] of one row per expert");
      if (m[3].numel()) {
        if (shared_inter < 0) shared_inter = input_width(m + 6, E);
        TORCH_CHECK(input_width(m + 3, 2 * shared_inter) == E, "layer ", l, ": the shared gate/up do not fit");
        TORCH_CHECK(input_width(m + 6, E) == shared_inter, "layer ", l, ": the shared down_proj does not fit");
        TORCH_CHECK(check_column_blocks(m[9], 1, at::kFloat) == E, "layer ", l,
                    ": the shared expert's gate must be float32 blocked [1, E, 16]");
      } else {
        for (int64_t j = 4; j < MLP_TENSORS[EXPERTS]; j++)
          TORCH_CHECK(m[j].numel() == 0, "layer ", l, ": without a shared expert its tensors must be empty");
      }
    }
    offset += 1 + MIXER_TENSORS[mixers[l]] + MLP_TENSORS[mlps[l]];
  }
  for (int64_t i = 0; i < attention_layers; i++)
    TORCH_CHECK(check_caches(key_caches[i], value_caches[i]) == check_caches(key_caches[0], value_caches[0]) &&
                    key_caches[i].sizes() == key_caches[0].sizes() && key_caches[i].size(1) == kv_heads &&
                    key_caches[i].size(2) == D,
                "attention layer ", i, ": caches must be [slots, kv heads, D] like the first layer's");
  const bool bf16 = attention_layers > 0 && check_caches(key_caches[0], value_caches[0]);
  if (attention_layers > 0) {
    check_slots(slots, T, key_caches[0].size(0));
    check_block_tables(block_tables, lengths, T, block_size, key_caches[0].size(0));
  }
  if (delta_layers > 0) check_state_slots(state_slots, fresh, T, delta.slots);
  const int64_t steps = check_steps(step_rows, step_starts, copies, copy_starts, state_slots, T, delta.slots);
  const StatePlan plan = steps == 0 ? StatePlan{} : plan_states(steps, step_starts.data_ptr<int64_t>(),
      state_slots.data_ptr<int64_t>(), copies.data_ptr<int64_t>(), copy_starts.data_ptr<int64_t>(), T);

  const int64_t value_width = delta.value_heads * delta.value_dim;
  const int64_t in_width = std::max(attention_layers ? n_qkv : 0, delta_layers ? delta.channels + value_width : 0);
  const auto options = hidden.options();
  at::Tensor x = x0.clone(), in = at::empty({T, in_width}, options);
  at::Tensor mixed_out = at::empty({T, std::max(attention_layers ? n_q : 0, value_width)}, options);
  at::Tensor gates = at::empty({T, 2 * delta.value_heads}, options), o = at::empty({T, E}, options);
  const int64_t widest = std::max({inter, shared_inter, int64_t{0}});  // the dense and shared experts' intermediates
  at::Tensor gate_up = at::empty({T, 2 * widest}, options), act = at::empty({T, widest}, options);
  at::Tensor mlp = at::empty({T, E}, options), shared = at::empty({T, shared_inter > 0 ? E : 0}, options);
  at::Tensor logits = at::empty({T, experts}, options), shared_gate = at::empty({T, 1}, options);
  at::Tensor route = at::empty({T, top_k}, options), chosen = at::empty({T, top_k}, options.dtype(at::kLong));
  float *h = hidden.data_ptr<float>(), *xp = x.data_ptr<float>(), *inp = in.data_ptr<float>();
  float *outp = mixed_out.data_ptr<float>(), *op = o.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  const float f_eps = static_cast<float>(eps);
  auto project = [&](const at::Tensor* w, const float* input, int64_t K, int64_t N, float* out) {
    if (w[0].scalar_type() == at::kBFloat16)
      qs::bf16b_matmul_avx512(input, T, K, half_bits(w[0]), N, out, dot_bf16);
    else
      qs::q4b_matmul_avx512(input, T, K, w[0].data_ptr<uint8_t>(), half_bits(w[1]), half_bits(w[2]), N, out, vnni);
  };
  int64_t attention_index = 0;
  offset = delta_index = 0;
  for (int64_t l = 0; l < L; l++) {
    const at::Tensor* w = weights.data() + offset + 1;  // the mixer's
    const at::Tensor* m = w + MIXER_TENSORS[mixers[l]];  // post_norm, gate_up, down
    if (mixers[l] == ATTENTION) {
      const int64_t i = attention_index++;
      const float* q_norm = w[3].numel() ? w[3].data_ptr<float>() : nullptr;
      const float* k_norm = w[4].numel() ? w[4].data_ptr<float>() : nullptr;
      project(w, xp, E, n_qkv, inp);
      qs::head_norm_rope(inp, T, n_qkv, heads, D, R, q_norm, f_eps, cp, sp);
      qs::head_norm_rope(inp + n_q, T, n_qkv, kv_heads, D, R, k_norm, f_eps, cp, sp);
      qs::kv_write(inp + n_q, inp + n_q + n_kv, T, n_qkv, n_qkv, n_kv, slots.data_ptr<int64_t>(),
                   key_caches[i].data_ptr(), value_caches[i].data_ptr(), bf16);
      qs::paged_decode_avx512(inp, n_qkv, T, heads, D, key_caches[i].data_ptr(), value_caches[i].data_ptr(), bf16,
                              kv_heads, block_tables.data_ptr<int64_t>(), block_tables.size(1),
                              lengths.data_ptr<int64_t>(), block_size, static_cast<float>(scale), outp);
      if (output_gate) qs::sigmoid_mul(outp, inp + n_q + 2 * n_kv, T, n_q, n_qkv);
      project(w + 5, outp, n_q, E, op);
    } else {
      const int64_t i = delta_index++, in_stride = delta.channels + value_width;
      project(w, xp, E, in_stride, inp);
      const int64_t n_gates = 2 * delta.value_heads;
      qs::f32b_matmul_avx512(xp, T, E, w[3].data_ptr<float>(), n_gates, gates.data_ptr<float>());
      float *conv = conv_states[i].data_ptr<float>(), *state = states[i].data_ptr<float>();
      // n rows of mixed channels then z (`stride` apart), their gates, the state slots they read and
      // write (null: the same) and fresh flags -> out
      auto step = [&](const float* mixed, int64_t stride, const float* gate_rows, int64_t n, const int64_t* slot,
                      const int64_t* write, const bool* zeroed, float* out) {
        qs::gated_delta_decode(mixed, stride, mixed + delta.channels, stride, n, key_heads, delta.value_heads,
                               delta.key_dim, delta.value_dim, w[4].data_ptr<float>(), delta.taps, conv, state, slot,
                               write, zeroed, gate_rows, n_gates, w[5].data_ptr<float>(), w[6].data_ptr<float>(),
                               w[7].data_ptr<float>(), f_eps, out);
      };
      if (steps == 0) {
        step(inp, in_stride, gates.data_ptr<float>(), T, state_slots.data_ptr<int64_t>(), nullptr,
             fresh.data_ptr<bool>(), outp);
      } else {
        const int64_t *order = step_rows.data_ptr<int64_t>(), *start = step_starts.data_ptr<int64_t>();
        const int64_t conv_size = conv_states[i][0].numel(), state_size = states[i][0].numel();
        const float* gate_rows = gates.data_ptr<float>();
        std::vector<float> rows_in, rows_gates, rows_out;
        for (int64_t s = 0; s < steps; s++) {
          const int64_t n = start[s + 1] - start[s];
          rows_in.resize(n * in_stride), rows_gates.resize(n * n_gates), rows_out.resize(n * value_width);
          for (int64_t j = 0; j < n; j++) {  // the step's rows gathered
            const int64_t row = order[start[s] + j];
            std::copy_n(inp + row * in_stride, in_stride, rows_in.data() + j * in_stride);
            std::copy_n(gate_rows + row * n_gates, n_gates, rows_gates.data() + j * n_gates);
          }
          step(rows_in.data(), in_stride, rows_gates.data(), n, plan.read.data() + start[s],
               plan.write.data() + start[s], fresh.data_ptr<bool>() + start[s], rows_out.data());
          for (int64_t j = 0; j < n; j++)
            std::copy_n(rows_out.data() + j * value_width, value_width, outp + order[start[s] + j] * value_width);
          // the copies left (plan_states) on every thread: a state is ~1 MiB (Qwen3.5: 16 heads x 128 x
          // 128 float32); copied by one thread they cost more than the Python of the per-op path saved
          const auto& copied = plan.copied[s];
          const int64_t n_copies = static_cast<int64_t>(copied.size()), pieces = (state_size + 16383) / 16384;
          at::parallel_for(0, n_copies * pieces, 1, [&](int64_t begin, int64_t end) {
            for (int64_t task = begin; task < end; task++) {
              const int64_t piece = task % pieces;
              const int64_t from = copied[task / pieces].first, to = copied[task / pieces].second;
              const int64_t first = piece * 16384, count = std::min<int64_t>(16384, state_size - first);
              std::copy_n(state + from * state_size + first, count, state + to * state_size + first);
              if (piece == 0) std::copy_n(conv + from * conv_size, conv_size, conv + to * conv_size);
            }
          });
        }
      }
      project(w + 8, outp, value_width, E, op);
    }
    qs::add_rms_norm(h, op, T, E, m[0].data_ptr<float>(), f_eps, xp);
    // down(silu(gate(xp)) * up(xp)) for gate/up and down at g (codes/scale/zero each) -> out
    auto swiglu = [&](const at::Tensor* g, int64_t width, float* out) {
      project(g, xp, E, 2 * width, gate_up.data_ptr<float>());
      qs::silu_mul(gate_up.data_ptr<float>(), gate_up.data_ptr<float>() + width, T, width, 2 * width, 2 * width,
                   act.data_ptr<float>());
      project(g + 3, act.data_ptr<float>(), width, E, out);
    };
    if (mlps[l] == DENSE) {
      swiglu(m + 1, inter, mlp.data_ptr<float>());
    } else {  // as decoder_layer.SparseMoELayer: route, the chosen experts, the gated shared expert
      qs::f32b_matmul_avx512(xp, T, E, m[1].data_ptr<float>(), experts, logits.data_ptr<float>());
      qs::route_top_k(logits.data_ptr<float>(), T, experts, top_k, normalize, route.data_ptr<float>(),
                      chosen.data_ptr<int64_t>());
      qs::q4b_moe_vnni8(xp, T, E, top_k, chosen.data_ptr<int64_t>(), route.data_ptr<float>(),
                        m[2].data_ptr<int64_t>(), experts, expert_inter, mlp.data_ptr<float>());
      if (m[3].numel()) {
        swiglu(m + 3, shared_inter, shared.data_ptr<float>());
        qs::f32b_matmul_avx512(xp, T, E, m[9].data_ptr<float>(), 1, shared_gate.data_ptr<float>());
        qs::add_sigmoid_gated(mlp.data_ptr<float>(), shared.data_ptr<float>(), shared_gate.data_ptr<float>(), 1, T, E);
      }
    }
    offset += 1 + MIXER_TENSORS[mixers[l]] + MLP_TENSORS[mlps[l]];
    if (l + 1 < L) qs::add_rms_norm(h, mlp.data_ptr<float>(), T, E, weights[offset].data_ptr<float>(), f_eps, xp);
  }
  return mlp;
}

// Blocks [first, stop) of the blocked bfloat16 layout into out [K, >= 16 * (stop - first)], float32
// or bfloat16 with contiguous rows: the transposed prefill tile.
void bf16b_unpack_avx512_(const at::Tensor& codes, int64_t first, int64_t stop, at::Tensor out) {
  require_bf16b(false);
  const int64_t K = check_bf16b_weight(codes, codes.size(0) * 16);
  TORCH_CHECK(0 <= first && first <= stop && stop <= codes.size(0), "blocks [", first, ", ", stop, ") out of range");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == K && out.size(1) >= 16 * (stop - first) && out.stride(1) == 1 &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "out must be float32 or bfloat16 [K, 16 * blocks] with contiguous rows");
  qs::bf16b_unpack_avx512(reinterpret_cast<const uint16_t*>(codes.data_ptr()), K, first, stop, out.data_ptr(),
                          out.stride(0), out.scalar_type() == at::kBFloat16);
}

// Gated DeltaNet's decode step (kernels.h): mixed [B, C] and z [B, Hv * dv] rows at strides of
// their own (column slices of the merged in_proj output); conv_state [S, taps - 1, C] and state
// [S, Hv, dk, dv] the storage's own contiguous float32 tensors, updated in place at rows slots.
at::Tensor gated_delta_decode_(const at::Tensor& mixed, const at::Tensor& z, const at::Tensor& conv_weight,
                               at::Tensor conv_state, at::Tensor state, const at::Tensor& slots,
                               const at::Tensor& fresh, const at::Tensor& gates, const at::Tensor& decay_rate,
                               const at::Tensor& dt_bias, const at::Tensor& norm_weight, int64_t key_heads,
                               double eps) {
  check_strided_rows(mixed, "mixed");
  check_strided_rows(z, "z");
  check_strided_rows(gates, "gates");
  const DeltaShape shape = check_delta(conv_weight, conv_state, state, decay_rate, dt_bias, norm_weight, key_heads);
  const int64_t B = mixed.size(0), Hv = shape.value_heads, dk = shape.key_dim, dv = shape.value_dim;
  const int64_t C = shape.channels, taps = shape.taps;
  TORCH_CHECK(mixed.dim() == 2 && mixed.size(1) == C, "mixed must have ", C, " channels");
  TORCH_CHECK(z.dim() == 2 && z.size(0) == B && z.size(1) == Hv * dv, "z must be [B, Hv * dv]");
  TORCH_CHECK(gates.dim() == 2 && gates.size(0) == B && gates.size(1) == 2 * Hv, "gates must be [B, 2 Hv]");
  check_state_slots(slots, fresh, B, shape.slots);
  const int64_t* slot = slots.data_ptr<int64_t>();
  at::Tensor out = at::empty({B, Hv * dv}, mixed.options());
  qs::gated_delta_decode(mixed.data_ptr<float>(), mixed.stride(0), z.data_ptr<float>(), z.stride(0), B, key_heads, Hv,
                         dk, dv, conv_weight.data_ptr<float>(), taps, conv_state.data_ptr<float>(),
                         state.data_ptr<float>(), slot, nullptr, fresh.data_ptr<bool>(), gates.data_ptr<float>(),
                         gates.stride(0), decay_rate.data_ptr<float>(), dt_bias.data_ptr<float>(),
                         norm_weight.data_ptr<float>(), static_cast<float>(eps), out.data_ptr<float>());
  return out;
}

// One sequence's prefill chunk through Gated DeltaNet's convolution (kernels.h): mixed [T, C] rows at
// a stride of their own, history [taps - 1, C] contiguous float32, updated in place -> [T, C].
at::Tensor gated_delta_conv_(const at::Tensor& mixed, const at::Tensor& conv_weight, at::Tensor history,
                             int64_t key_heads, int64_t key_dim) {
  check_strided_rows(mixed, "mixed");
  check_rows(conv_weight, "conv_weight");
  check_rows(history, "history");
  const int64_t T = mixed.size(0), C = mixed.size(1), taps = conv_weight.size(0);
  TORCH_CHECK(mixed.dim() == 2 && conv_weight.dim() == 2 && conv_weight.size(1) == C, "mixed [T, C] and conv_weight "
              "[taps, C] expected");
  TORCH_CHECK(history.dim() == 2 && history.size(0) == taps - 1 && history.size(1) == C, "history must be [",
              taps - 1, ", ", C, "]");
  TORCH_CHECK(key_heads > 0 && key_dim > 0 && 2 * key_heads * key_dim <= C, "q and k must fit the channels");
  at::Tensor out = at::empty({T, C}, mixed.options());
  qs::gated_delta_conv(mixed.data_ptr<float>(), mixed.stride(0), T, key_heads, key_dim, C,
                       conv_weight.data_ptr<float>(), taps, history.data_ptr<float>(), out.data_ptr<float>());
  return out;
}

// The delta rule's readings [T, Hv * dv] (contiguous float32), in place: RMSNorm per head times SiLU(z).
void gated_delta_gate_(at::Tensor out, const at::Tensor& z, const at::Tensor& norm_weight, double eps) {
  check_rows(out, "out");
  check_strided_rows(z, "z");
  check_rows(norm_weight, "norm_weight");
  const int64_t dv = norm_weight.numel();
  TORCH_CHECK(dv > 0 && dv <= 512 && out.dim() == 2 && out.size(1) % dv == 0, "out must be [T, heads * ", dv, "]");
  TORCH_CHECK(z.dim() == 2 && z.sizes() == out.sizes(), "z must be shaped as out");
  qs::gated_delta_gate(out.data_ptr<float>(), z.data_ptr<float>(), z.stride(0), out.size(0), out.size(1) / dv, dv,
                       norm_weight.data_ptr<float>(), static_cast<float>(eps));
}

// The chunked delta rule's triangular solve (kernels.h): system [H, n, n] and rhs [H, n, cols], both
// contiguous float32; rhs is overwritten by (I + strictly lower(system))^-1 rhs.
void unit_lower_solve_(const at::Tensor& system, at::Tensor rhs) {
  check_rows(system, "system");
  check_rows(rhs, "rhs");
  TORCH_CHECK(system.dim() == 3 && system.size(1) == system.size(2), "system must be [heads, n, n]");
  TORCH_CHECK(rhs.dim() == 3 && rhs.size(0) == system.size(0) && rhs.size(1) == system.size(1),
              "rhs must be [heads, n, cols] for system [heads, n, n]");
  qs::unit_lower_solve(system.data_ptr<float>(), system.size(0), system.size(1), rhs.data_ptr<float>(), rhs.size(2));
}

}  // namespace

TORCH_LIBRARY(qwen_serve, m) {
  m.def("q4_matmul_avx2", &q4_matmul_avx2);
  m.def("q8_matmul_avx2", &q8_matmul_avx2);
  m.def("q4_dequant_split_avx2(Tensor packed, Tensor scale, Tensor zero, Tensor(a!) out) -> ()", &q4_dequant_split_avx2);
  m.def("permute_groups", &permute_groups);
  m.def("q4b_matmul_avx512", &q4b_matmul_avx512);
  m.def("q8b_matmul_avx512", &q8b_matmul_avx512);
  m.def("q6b_matmul_vnni8", &q6b_matmul_vnni8);
  m.def("q4b_unpack_avx512_(Tensor codes, Tensor scale, Tensor zero, int first, int stop, Tensor(a!) out) -> ()",
        &q4b_unpack_avx512_);
  m.def("paged_decode_avx512", &paged_decode_avx512);
  m.def("paged_decode_avx2", &paged_decode_avx2);
  m.def("kv_write_(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slots, Tensor keys, Tensor values) -> ()", &kv_write_);
  m.def("bf16b_matmul_avx512", &bf16b_matmul_avx512);
  m.def("f32b_matmul_avx512", &f32b_matmul_avx512);
  m.def("f32b_matmul_avx2", &f32b_matmul_avx2);
  m.def("bf16c_matmul_avx2", &bf16c_matmul_avx2);
  m.def("bf16b_unpack_avx512_(Tensor codes, int first, int stop, Tensor(a!) out) -> ()", &bf16b_unpack_avx512_);
  m.def("rms_norm", &rms_norm);
  m.def("add_rms_norm_(Tensor(a!) hidden, Tensor delta, Tensor weight, float eps) -> Tensor", &add_rms_norm_);
  m.def("head_norm_rope_(Tensor(a!) x, Tensor? weight, float eps, Tensor cos, Tensor sin) -> ()", &head_norm_rope_);
  m.def("silu_mul", &silu_mul);
  m.def("sigmoid_mul_(Tensor(a!) x, Tensor gate) -> ()", &sigmoid_mul_);
  m.def("q4b_moe_vnni8", &q4b_moe_vnni8);
  m.def("moe_route", &moe_route);
  m.def("add_sigmoid_gated_(Tensor(a!) out, Tensor x, Tensor gate) -> ()", &add_sigmoid_gated_);
  m.def("gated_delta_decode_(Tensor mixed, Tensor z, Tensor conv_weight, Tensor(a!) conv_state, Tensor(b!) state, "
        "Tensor slots, Tensor fresh, Tensor gates, Tensor decay_rate, Tensor dt_bias, Tensor norm_weight, "
        "int key_heads, float eps) -> Tensor",
        &gated_delta_decode_);
  m.def("gated_delta_conv_(Tensor mixed, Tensor conv_weight, Tensor(a!) history, int key_heads, int key_dim) "
        "-> Tensor", &gated_delta_conv_);
  m.def("gated_delta_gate_(Tensor(a!) out, Tensor z, Tensor norm_weight, float eps) -> ()", &gated_delta_gate_);
  m.def("unit_lower_solve_(Tensor system, Tensor(a!) rhs) -> ()", &unit_lower_solve_);
  m.def("decode_layers_(Tensor(a!) hidden, Tensor x, int[] mixers, int[] mlps, Tensor[] weights, "
        "Tensor(b!)[] key_caches, "
        "Tensor(c!)[] value_caches, Tensor(d!)[] conv_states, Tensor(e!)[] states, Tensor cos, Tensor sin, "
        "Tensor slots, Tensor block_tables, Tensor lengths, Tensor state_slots, Tensor fresh, Tensor step_rows, "
        "Tensor step_starts, Tensor copies, Tensor copy_starts, int block_size, "
        "int heads, int kv_heads, int head_dim, bool output_gate, int key_heads, int top_k, bool normalize, "
        "int expert_inter, float eps, float scale, bool vnni, bool dot_bf16) -> Tensor", &decode_layers_);
}
