// cuda-hopper backward: the gradients' staged epilogue (where
// BackwardParams::grads_by_tma: docs/decisions/hopper-backward-gradients-by-tma.md,
// staged by stmatrix: docs/decisions/hopper-backward-stmatrix-staging.md). At the end of a
// CTA the consumer warpgroups hold dK and dV (dK/dV kernel) or dQ (dQ
// kernel) as f32 wgmma accumulators, 64 rows x kDW columns per warpgroup.
// Instead of 32-bit stores from registers (store_rows), which a warp issues
// as scattered 16-byte pieces of 8 rows, they
//   1. wait until both warpgroups are past their last wgmma (staging_acquire:
//      the staging reuses ring slots the other warpgroup may still be
//      reading);
//   2. write the rounded rows, times a factor, into a K-major [64 x kDW]
//      tile of shared memory with the 128-byte swizzle the gradient's TMA
//      map expects (staged_store.cuh stage_rows);
//   3. fence the writes for the async proxy and wait for both warpgroups
//      again (staging_publish);
//   4. the first thread of each warpgroup stores its tiles, one TMA store
//      per 64 columns, which clips rows past the tensor's end
//      (store_staged_tile), then waits until the copies have read shared
//      memory (finish_gradient_stores) before the CTA may exit.
// Checked by tests/gpu/test_hopper_backward.cpp (NaN-poisoned gradients
// catch unwritten rows, padded strides writes outside the tensor; a dk
// stride TMA cannot store runs the plain stores and must give the same
// bits).
#pragma once

#include <cstdint>

#include "cuda/hopper/backward/dq_fused.cuh"
#include "cuda/hopper/backward/tile_sizes.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/staged_store.cuh"

namespace gqattn::hopper::bwd {

// Above every other barrier of the backward kernels (the fused dQ's,
// dq_fused.cuh, and the split by gradient's hand-over, dkdv_split_grad.cuh).
constexpr uint32_t kGradientStoreBarrier = ptx::kFirstNamedBarrier + 6;
static_assert(kDsFreeBarrier + 1 < kGradientStoreBarrier &&
                  kGradientStoreBarrier < ptx::kNamedBarrierCount,
              "the gradient store barrier ID is out of range");
constexpr uint32_t kConsumerThreads = kBwdConsumerWarpgroups * kWarpgroupThreads;

__device__ __forceinline__ void staging_acquire() {
  ptx::named_barrier_sync(kGradientStoreBarrier, kConsumerThreads);
}

__device__ __forceinline__ void staging_publish() {
  ptx::fence_proxy_async_shared();
  ptx::named_barrier_sync(kGradientStoreBarrier, kConsumerThreads);
}

// Issuer only, after its last store_staged_tile.
__device__ __forceinline__ void finish_gradient_stores() {
  ptx::bulk_commit();
  ptx::bulk_wait_read_all();
}

}  // namespace gqattn::hopper::bwd
