// cuda-hopper: the 1-D bulk copy global -> shared that completes on an
// mbarrier (PTX ISA "cp.async.bulk", sm_90), used by the backward to bring
// the per-row terms lse2 and D of a query tile next to its Q and dO tiles.
// Checked by compiling for sm_90a and by tests/gpu/test_hopper_backward.cpp.
//
// Requirements (PTX ISA): `dst` and `src` 16-byte aligned, `bytes` a
// multiple of 16; the bytes count towards the transaction count of `bar`,
// so the producer's arrive.expect_tx must include them.
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

}  // namespace gqattn::hopper::ptx
