// cuda-hopper: the device helpers of the fused dQ (DkdvTile::kFusedDqSupported):
// its barrier and back-off, and a warpgroup's f32 dQ partial into the staging
// buffer that one bulk reduce-add moves to the accumulator
// (backward_params.hpp dq_accum_block; read back by backward_dq_convert.cuh).
// Checked by tests/gpu/test_hopper_backward.cpp (dq against the f64 oracle,
// bitwise determinism).
#pragma once

#include <cstdint>

#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/tile_sizes.hpp"

namespace gqattn::hopper::bwd {

// Named barrier of the two consumer warpgroups: both halves of a step's dS
// are in shared memory.
constexpr uint32_t kDsReadyBarrier = ptx::kFirstNamedBarrier;

// Back-off of the dQ writer while it waits for its turn to add.
constexpr unsigned kDqSpinNs = 64;

// Stores a warpgroup's dQ partial (wgmma accumulator, kCols columns) to
// `dst`: n8 block c of thread i at float4 c * 128 + i (contiguous per warp).
template <int kCols>
__device__ __forceinline__ void stage_dq(uint32_t dst, const float (&dq)[kCols / 8][4]) {
  const uint32_t i = threadIdx.x % kWarpgroupThreads;
#pragma unroll
  for (int c = 0; c < kCols / 8; ++c) {
    const uint32_t addr = dst + (uint32_t(c) * kWarpgroupThreads + i) * 16u;
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(dq[c][0]),
                 "f"(dq[c][1]), "f"(dq[c][2]), "f"(dq[c][3])
                 : "memory");
  }
}

}  // namespace gqattn::hopper::bwd
