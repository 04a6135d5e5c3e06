// The fused KV-cache path (cuda-flash and cuda-hopper): the plain-data
// arguments its host side (kv_cache_path.cpp) hands to the launchers. No
// CUDA types here, so host code fills them with the host compiler. Checked
// through tests/gpu/test_kv_cache.cpp.
#pragma once

#include <cstdint>

#include "cuda/fused/params.hpp"

namespace gqattn::kv_cache {

// Where sequence b's keys live: key position pos is row pos % page_size of
// page block_table[b * pages_per_seq + pos / page_size] (paged), or row pos
// of cache row batch_idx[b] (or b) (dense, page_size 0). Every index read
// from the int32 vectors is clamped into the cache (page_rows.cuh).
struct CacheArgs {
  void* k = nullptr;  // [cache_rows, page_size or capacity, Hkv, d]; the append writes it
  void* v = nullptr;
  fused::RowStrides k_stride, v_stride;  // batch = one page (or dense cache row)
  const int* seqlens = nullptr;          // [B]: keys already cached
  const int* block_table = nullptr;      // paged: [B * pages_per_seq]
  const int* batch_idx = nullptr;        // dense, optional: [B]
  int pages_per_seq = 0;
  int page_size = 0;   // 0: dense
  int cache_rows = 0;  // pages, or dense cache rows
  int capacity = 0;    // keys per sequence: Problem::Tk
};

struct Params {
  const void* q = nullptr;  // [B, Tq, H, d]
  void* o = nullptr;
  float* lse = nullptr;  // may be null: then not written
  fused::RowStrides q_stride, o_stride;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  CacheArgs cache;
  // New keys and values [B, t_new, Hkv, d], appended before the attention
  // (null when t_new is 0).
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  fused::RowStrides k_new_stride, v_new_stride;
  int t_new = 0;
  int B = 0, Tq = 0, H = 0, Hkv = 0;
  int head_dim = 0;  // the tensors' d: the kernel's own, or less (padded)
  bool causal = false;
  int window = 0;  // Problem::window capped to int; normalised per sequence
  bool q_start_given = false;
  int q_start = 0;
  fused::ScoreArgs score;
  // Split-KV (plan.hpp): a CTA covers split s of its key tiles. With
  // tiles_per_split > 0 every split is that many tiles long (the batch
  // invariant rule); else a CTA's tiles are shared evenly over num_splits.
  // num_splits > 1: partial results go to o_part [num_splits, B, H, Tq, kD]
  // and lse_part [num_splits, B, H, Tq] (f32), which the combine kernel
  // reduces in split order.
  int num_splits = 1;
  int tiles_per_split = 0;
  float* o_part = nullptr;
  float* lse_part = nullptr;
};

}  // namespace gqattn::kv_cache
