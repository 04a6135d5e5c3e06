// cuda-hopper backward: the gradients' staged epilogue (where
// bwd_tma_store_gradients(d) and BackwardParams::grads_by_tma). At the end of a CTA the consumer
// warpgroups hold dK and dV (dK/dV kernel) or dQ (dQ kernel) as f32 wgmma
// accumulators, 64 rows x kDW columns per warpgroup. Instead of 32-bit
// stores from registers (store_rows), which a warp issues as scattered
// 16-byte pieces of 8 rows, they
//   1. wait until both warpgroups are past their last wgmma (staging_acquire:
//      the staging reuses ring slots the other warpgroup may still be
//      reading);
//   2. write the rounded rows, times a factor, into a K-major [64 x kDW]
//      tile of shared memory with the 128-byte swizzle the gradient's TMA
//      map expects (stage_gradient);
//   3. fence the writes for the async proxy and wait for both warpgroups
//      again (staging_publish);
//   4. the first thread of each warpgroup stores its tiles, one TMA store
//      per 64 columns, which clips rows past the tensor's end
//      (store_gradient_tile), then waits until the copies have read shared
//      memory (finish_gradient_stores) before the CTA may exit.
// Checked by tests/gpu/test_hopper_backward.cpp (NaN-poisoned gradients
// catch unwritten rows, padded strides writes outside the tensor; a dk
// stride TMA cannot store runs the plain stores and must give the same
// bits).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/flash/mma.cuh"
#include "cuda/hopper/backward_split_exchange.cuh"
#include "cuda/hopper/backward_tile_sizes.hpp"
#include "cuda/hopper/operand_layout.hpp"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/tma.cuh"
#include "cuda/hopper/tile_sizes.hpp"

namespace gqattn::hopper::bwd {

// After every other barrier of the backward kernels (8 .. 13).
constexpr uint32_t kGradientStoreBarrier = kXchgSentBarrier + 2;
static_assert(kGradientStoreBarrier < ptx::kNamedBarrierCount,
              "the gradient store barrier ID is out of range");
constexpr uint32_t kConsumerThreads = kBwdConsumerWarpgroups * kWarpgroupThreads;

// Bytes of one warpgroup's staged tile of kDW columns.
template <int kDW>
constexpr uint32_t gradient_tile_bytes() {
  return uint32_t(kWgmmaM) * kDW * kElemBytes;
}

__device__ __forceinline__ void staging_acquire() {
  ptx::named_barrier_sync(kGradientStoreBarrier, kConsumerThreads);
}

__device__ __forceinline__ void staging_publish() {
  ptx::fence_proxy_async_shared();
  ptx::named_barrier_sync(kGradientStoreBarrier, kConsumerThreads);
}

// The thread of each consumer warpgroup that issues its stores (and owns
// their bulk async-group).
__device__ __forceinline__ bool gradient_store_issuer() {
  return int(threadIdx.x) % kWarpgroupThreads == 0;
}

// This thread's part of acc * mult, rounded, into the tile at `staging`
// (1024-byte aligned). Per store instruction the 8 rows of a warp hit 8
// different 16-byte chunks (the swizzle XORs the chunk with row % 8): no
// bank conflict.
template <int kDW, typename Elem>
__device__ __forceinline__ void stage_gradient(uint32_t staging, const float (&acc)[kDW / 8][4],
                                               float mult) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int col0 = flash::frag_col(lane);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp * flash::kMmaM + flash::frag_row(lane) + half * flash::kFragRowHalf;
#pragma unroll
    for (int i = 0; i < kDW / 8; ++i) {
      const uint32_t addr = staging + k_major_offset(row, i * 8 + col0, kWgmmaM);
      const uint32_t pair =
          flash::pack2<Elem>(acc[i][2 * half] * mult, acc[i][2 * half + 1] * mult);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pair) : "memory");
    }
  }
}

// Issuer only, after staging_publish: rows [row0, row0 + 64), columns
// [col0, col0 + kDW) of `map` (d, heads, T, B) at (head, batch).
template <int kDW>
__device__ __forceinline__ void store_gradient_tile(const CUtensorMap* map, uint32_t staging,
                                                    int row0, int col0, int head, int batch) {
  constexpr uint32_t kBlockBytes = uint32_t(kWgmmaM) * kSwizzleBytes;
#pragma unroll
  for (int c = 0; c < kDW / kColBlock; ++c)
    ptx::tma_store_4d(map, staging + c * kBlockBytes, col0 + c * kColBlock, head, row0, batch);
}

// Issuer only, after its last store_gradient_tile.
__device__ __forceinline__ void finish_gradient_stores() {
  ptx::bulk_commit();
  ptx::bulk_wait_read_all();
}

}  // namespace gqattn::hopper::bwd
