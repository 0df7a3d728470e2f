// Shared by the kernel sources: per-ISA target attributes and the int16 activation format.
//
// Every kernel is compiled for its own instruction set with a function attribute, so one library
// holds the AVX2 and AVX-512 variants and Python picks among them at run time (by the CPU's
// flags, minus any named in QWEN_SERVE_DISABLE_ISA). Nothing here runs unless chosen, so the
// library loads on any x86-64 CPU.
#pragma once

#include <cstdint>
#include <vector>

#define QS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define QS_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define QS_INLINE inline __attribute__((always_inline))

namespace qs {

constexpr int64_t GROUP = 64;

// Activations as int16 per group of 64 (relative error ~1e-5: the float result for all practical
// purposes), with each group's scale and exact float sum (for the zero points).
struct Activations {
  std::vector<int16_t> q;  // [M, K]; `split` orders each group's columns evens then odds
  std::vector<float> scale;  // [M, K / 64]
  std::vector<float> sum;  // [M, K / 64]
};

Activations quantize_activations_avx2(const float* x, int64_t M, int64_t K, bool split);
Activations quantize_activations_avx512(const float* x, int64_t M, int64_t K);

}  // namespace qs
