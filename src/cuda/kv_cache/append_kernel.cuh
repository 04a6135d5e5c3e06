// The fused KV-cache path's first kernel: the new keys and values of each
// sequence written into the cache in place, k_new[b, t] at key position
// cache_seqlens[b] + t (page_rows.cuh clamps every index), one 16-byte
// chunk per thread (the tensors are 16-byte aligned, why_not_tensor). The
// attention kernel runs after it on the same stream. Checked element by
// element by tests/gpu/test_kv_cache.cpp (new keys where they belong, every
// other cache element untouched).
#pragma once

#include <cstdint>

#include "cuda/fused/params.hpp"
#include "cuda/kv_cache/page_rows.cuh"

namespace gqattn::kv_cache {

constexpr int kAppendThreads = 256;

__global__ void __launch_bounds__(kAppendThreads) append_kernel(const Params p) {
  constexpr int kElemBytes = 2;  // bf16 or f16: the copy moves bytes
  const int chunks = p.head_dim / fused::kElemsPerChunk;
  const int64_t total = int64_t(p.B) * p.t_new * p.Hkv * chunks;
  for (int64_t e = int64_t(blockIdx.x) * kAppendThreads + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * kAppendThreads) {
    const int c = int(e % chunks);
    const int hk = int(e / chunks % p.Hkv);
    const int t = int(e / (int64_t(chunks) * p.Hkv) % p.t_new);
    const int b = int(e / (int64_t(chunks) * p.Hkv * p.t_new));
    const SequenceCache seq = sequence_cache(p.cache, p.t_new, b);
    const SequenceCache::Slot at = seq.slot(seq.cached + t);
    const int64_t col = int64_t(c) * fused::kElemsPerChunk;
    const auto* k_src =
        static_cast<const unsigned char*>(p.k_new) +
        (b * p.k_new_stride.batch + t * p.k_new_stride.row + hk * p.k_new_stride.head + col) *
            kElemBytes;
    const auto* v_src =
        static_cast<const unsigned char*>(p.v_new) +
        (b * p.v_new_stride.batch + t * p.v_new_stride.row + hk * p.v_new_stride.head + col) *
            kElemBytes;
    auto* k_dst = static_cast<unsigned char*>(p.cache.k) +
                  (SequenceCache::offset(at, p.cache.k_stride) + hk * p.cache.k_stride.head + col) *
                      kElemBytes;
    auto* v_dst = static_cast<unsigned char*>(p.cache.v) +
                  (SequenceCache::offset(at, p.cache.v_stride) + hk * p.cache.v_stride.head + col) *
                      kElemBytes;
    *reinterpret_cast<uint4*>(k_dst) = *reinterpret_cast<const uint4*>(k_src);
    *reinterpret_cast<uint4*>(v_dst) = *reinterpret_cast<const uint4*>(v_src);
  }
}

}  // namespace gqattn::kv_cache
