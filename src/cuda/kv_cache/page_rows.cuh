// The fused KV-cache path: where sequence b's key positions live in the
// cache, and how many keys it has, from the int32 vectors in device memory.
// Every value read from them is clamped, so vectors the library did not
// check (Options::check_offsets off) can give wrong numbers, never an
// access outside the cache: cached keys in [0, capacity - t_new], pages and
// dense rows in [0, cache_rows). Checked by tests/gpu/test_kv_cache.cpp
// (unchecked bad vectors under compute-sanitizer memcheck).
#pragma once

#include <cstdint>

#include "cuda/fused/sequence.hpp"
#include "cuda/kv_cache/params.hpp"

namespace gqattn::kv_cache {

struct SequenceCache {
  const int* pages = nullptr;  // this sequence's block_table row (paged)
  int64_t dense_row = 0;       // its cache row (dense)
  int page_size = 0;
  int cache_rows = 0;
  int cached = 0;  // keys in the cache before the append
  int keys = 0;    // keys attended: cached + t_new

  // Where key position pos (0 <= pos < capacity) lives: its page (or dense
  // cache row) and its row there.
  struct Slot {
    int64_t page;
    int row;
  };
  __device__ __forceinline__ Slot slot(int pos) const {
    if (pages == nullptr) return {dense_row, pos};
    return {fused::clamp_to(pages[pos / page_size], 0, cache_rows - 1), pos % page_size};
  }
  // The element offset of a slot in a cache tensor of strides s, head
  // dimension excluded.
  __device__ __forceinline__ static int64_t offset(Slot at, const fused::RowStrides& s) {
    return at.page * s.batch + int64_t(at.row) * s.row;
  }
};

__device__ __forceinline__ SequenceCache sequence_cache(const CacheArgs& c, int t_new, int b) {
  SequenceCache s;
  s.page_size = c.page_size;
  s.cache_rows = c.cache_rows;
  s.cached = fused::clamp_to(c.seqlens[b], 0, c.capacity - t_new);
  s.keys = s.cached + t_new;
  if (c.block_table != nullptr) {
    s.pages = c.block_table + int64_t(b) * c.pages_per_seq;
  } else {
    s.dense_row = c.batch_idx != nullptr ? fused::clamp_to(c.batch_idx[b], 0, c.cache_rows - 1) : b;
  }
  return s;
}

}  // namespace gqattn::kv_cache
