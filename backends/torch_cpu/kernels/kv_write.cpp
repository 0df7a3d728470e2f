// A step's new keys and values into their cache slots in one call: the k and v columns of the
// merged q/k/v output are read where they lie (rows at a stride) and rounded to the cache's
// dtype on the way, where torch took a copy, a conversion and an index_copy for each of them.
#include <cmath>
#include <cstring>

#include "kernels.h"

namespace qs {
namespace {

// float32 -> bfloat16, round to nearest even (what torch's .to(torch.bfloat16) does).
inline uint16_t to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

void write_rows(const float* src, int64_t T, int64_t src_stride, int64_t n, const int64_t* slots, void* cache,
                bool bf16) {
  for (int64_t t = 0; t < T; t++) {
    const float* row = src + t * src_stride;
    if (bf16) {
      uint16_t* dst = static_cast<uint16_t*>(cache) + slots[t] * n;
      for (int64_t i = 0; i < n; i++) dst[i] = to_bf16(row[i]);
    } else {
      std::memcpy(static_cast<float*>(cache) + slots[t] * n, row, n * sizeof(float));
    }
  }
}

}  // namespace

void kv_write(const float* keys, const float* values, int64_t T, int64_t key_stride, int64_t value_stride, int64_t n,
              const int64_t* slots, void* key_cache, void* value_cache, bool bf16) {
  write_rows(keys, T, key_stride, n, slots, key_cache, bf16);
  write_rows(values, T, value_stride, n, slots, value_cache, bf16);
}

}  // namespace qs
