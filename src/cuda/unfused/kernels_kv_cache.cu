// copy_slots: copies rows of (heads x d) elements from one [B, T, heads, d]
// tensor to another, row r from slot src_slots[r] = (b, t) to slot
// dst_slots[r] (or, without dst_slots, to row r of batch 0), one thread per
// element. cuda-unfused's KV-cache path uses it
// twice: to append the new keys and values into the cache (k_new (b, t) to
// the cache slot of position seqlens[b] + t), and to gather a sequence's keys
// from the cache (dense rows or pages) into a contiguous [1, keys, Hkv, d]
// buffer that the dense forward then reads, as the CPU mirror does. The slot
// tables are built on the host from the checked host copy of the cache's
// vectors, so every slot is in bounds. Checked by tests/gpu/test_kv_cache.cpp
// (the append element by element, the rest of the cache untouched, results
// against the oracle over an independently gathered cache).
#include "cuda/common/cuda_check.hpp"
#include "cuda/unfused/kernels_common.cuh"

namespace gqattn::cuda::unfused {
namespace {

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    copy_slots(const T* src, RowStrides src_stride, const int64_t* src_slots, T* dst,
               RowStrides dst_stride, const int64_t* dst_slots, int64_t rows, int64_t heads,
               int64_t d) {
  const int64_t elements = rows * heads * d;
  for (int64_t e = first_row(); e < elements; e += row_step()) {
    const int64_t x = e % d, h = (e / d) % heads, r = e / (d * heads);
    const T* from = at(src, src_stride, src_slots[2 * r], src_slots[2 * r + 1], h);
    T* to = dst_slots != nullptr ? at(dst, dst_stride, dst_slots[2 * r], dst_slots[2 * r + 1], h)
                                 : at(dst, dst_stride, 0, r, h);
    to[x] = from[x];
  }
}

}  // namespace

void launch_copy_slots(const SlotCopy& copy, const Launch& launch) {
  const int64_t elements = copy.rows * copy.heads * copy.d;
  if (elements == 0) return;  // a grid of no blocks is a launch error
  with_element_type(copy.dtype, [&](auto tag) {
    using T = decltype(tag);
    copy_slots<T><<<grid_blocks(elements, launch), kThreadsPerBlock, 0, launch.stream>>>(
        static_cast<const T*>(copy.src.data), copy.src.stride, copy.src_slots,
        static_cast<T*>(copy.dst.data), copy.dst.stride, copy.dst_slots, copy.rows, copy.heads,
        copy.d);
    check_launch("copy_slots");
  });
}

}  // namespace gqattn::cuda::unfused
