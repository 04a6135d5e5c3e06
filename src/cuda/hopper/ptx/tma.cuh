// cuda-hopper: device side of the Tensor Memory Accelerator: prefetching a
// tensor map, the 4-D tiled bulk copy global -> shared that completes on an
// mbarrier, and the 4-D tiled store shared -> global tracked by the issuing
// thread's bulk async-group (PTX ISA "cp.async.bulk.tensor"). The maps are
// built on the host by tma_desc.cpp. Checked by compiling for sm_90a and by
// tests/gpu/test_hopper_forward.cpp.
//
// Loads: out-of-bounds box elements are written as zeros and still count
// towards the transaction bytes, so a partial tile expects as many bytes as
// a full one. Stores: out-of-bounds box elements are not written.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace gqattn::hopper::ptx {

// `map` must live in parameter, constant or global memory (a
// __grid_constant__ kernel parameter here).
__device__ __forceinline__ void tma_prefetch(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Copies the box at coordinates (c0, c1, c2, c3) (innermost first) of `map`
// to shared memory at `dst`, then completes its bytes on mbarrier `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// The same copy delivered to every CTA of the cluster in `cta_mask` (bit r:
// rank r), at the same offset `dst` in each, completing its bytes on the
// mbarrier at offset `bar` in each (PTX ISA: .multicast::cluster).
__device__ __forceinline__ void tma_load_4d_multicast(uint32_t dst, const CUtensorMap* map,
                                                      uint32_t bar, uint16_t cta_mask, int c0,
                                                      int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%4, %5, %6, %7}], [%2], %3;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

// Copies the box at `src` (shared memory, laid out as the map's swizzle
// says) to coordinates (c0, c1, c2, c3) of `map`; completes with the
// thread's bulk async-group (ptx/bulk_reduce.cuh: bulk_commit, then
// bulk_wait_read_all before `src` is overwritten). Shared-memory writes of
// other threads must be fenced (fence_proxy_async_shared) and synchronised
// before the issue.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

}  // namespace gqattn::hopper::ptx
