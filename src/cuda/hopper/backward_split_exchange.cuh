// cuda-hopper: the S / dP exchange of the backward's split-over-d form
// (d = 256, backward_tile_sizes.hpp split_exchange): both consumer
// warpgroups own the same 64 rows and need all of P and dP - D for their
// half of the d columns, but each computes only one of the two products
// (warpgroup 0 S, warpgroup 1 dP) and hands the f32 result to the other
// through shared memory. Used by the dK/dV and the dQ kernel alike.
// Checked by tests/gpu/test_hopper_backward.cpp (the d = 256 cases, against
// the f64 oracle and a bitwise rerun) and compute-sanitizer.
//
// Both warpgroups compute the same (row, column) elements with the same
// fragment layout, so thread i of one warpgroup reads exactly what thread i
// of the other wrote: buffer float4 j of thread i at (j * 128 + i) * 16
// bytes (a warp's 32 float4 are 512 contiguous bytes: no bank conflicts).
//
// Named barriers (256 threads: both warpgroups):
//   ready            both tiles written (bar.sync by both, every step);
//   free[w]          warpgroup 1 - w has read buffer w: it arrives after
//                    its read of step t (t < steps - 1), and warpgroup w
//                    syncs before its write of step t + 1, so every phase
//                    has 128 + 128 threads and none is left open at exit.
#pragma once

#include <cstdint>

#include "cuda/hopper/backward_dq_fused.cuh"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/tile_sizes.hpp"

namespace gqattn::hopper::bwd {

// After kDsReadyBarrier (the fused dQ's, d <= 128 only; never in the same
// kernel instance, but kept apart anyway).
constexpr uint32_t kXchgReadyBarrier = kDsReadyBarrier + 1;
constexpr uint32_t kXchgFreeBarrier = kXchgReadyBarrier + 1;  // buffer w: + w
static_assert(kXchgFreeBarrier + 1 < ptx::kNamedBarrierCount, "named barrier IDs run out");

constexpr uint32_t kXchgThreads = 2 * kWarpgroupThreads;

// Hands `mine` (warpgroup wg's product of step t of `steps`) to the other
// warpgroup and returns its product in `theirs`. `xchg` is the shared
// address of buffer 0 (buffer w at + w * bytes).
template <int kNT>
__device__ __forceinline__ void exchange_with_other_warpgroup(uint32_t xchg, int wg, int t,
                                                              int steps,
                                                              const float (&mine)[1][kNT][4],
                                                              float (&theirs)[1][kNT][4]) {
  constexpr uint32_t kBytes = uint32_t(kWarpgroupThreads) * kNT * 4 * sizeof(float);
  const uint32_t i = uint32_t(threadIdx.x) % kWarpgroupThreads;
  const uint32_t own = xchg + uint32_t(wg) * kBytes;
  const uint32_t other = xchg + uint32_t(1 - wg) * kBytes;
  // Buffer `own` is free once the other warpgroup has read step t - 1's.
  if (t > 0) ptx::named_barrier_sync(kXchgFreeBarrier + uint32_t(wg), kXchgThreads);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     own + (uint32_t(nt) * kWarpgroupThreads + i) * 16u),
                 "f"(mine[0][nt][0]), "f"(mine[0][nt][1]), "f"(mine[0][nt][2]), "f"(mine[0][nt][3])
                 : "memory");
  ptx::named_barrier_sync(kXchgReadyBarrier, kXchgThreads);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(theirs[0][nt][0]), "=f"(theirs[0][nt][1]), "=f"(theirs[0][nt][2]),
                   "=f"(theirs[0][nt][3])
                 : "r"(other + (uint32_t(nt) * kWarpgroupThreads + i) * 16u)
                 : "memory");
  if (t + 1 < steps) ptx::named_barrier_arrive(kXchgFreeBarrier + uint32_t(1 - wg), kXchgThreads);
}

}  // namespace gqattn::hopper::bwd
