// A step's new keys and values into their cache slots in one call: the k and v columns of the
// merged q/k/v output are read where they lie (rows at a stride) and rounded to the cache's
// dtype on the way, where torch took a copy, a conversion and an index_copy for each of them.
#include <cstring>

#include "common.h"
#include "kernels.h"

namespace qs {
namespace {

void write_rows(const float* src, int64_t T, int64_t src_stride, int64_t n, const int64_t* slots, void* cache,
                bool bf16) {
  for (int64_t t = 0; t < T; t++) {
    const float* row = src + t * src_stride;
    if (bf16) {
      uint16_t* dst = static_cast<uint16_t*>(cache) + slots[t] * n;
      for (int64_t i = 0; i < n; i++) dst[i] = bf16_bits(row[i]);
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
