// cuda-hopper: the device helpers of the fused dQ (DkdvTile::kFusedDqSupported): dS^T
// from a consumer warpgroup's registers into the shared dS buffer that the
// dQ = dS K wgmma reads, and a warpgroup's f32 dQ partial into the staging
// buffer that one bulk reduce-add moves to the accumulator
// (backward_params.hpp dq_accum_block; read back by backward_dq_convert.cuh).
// Checked by tests/gpu/test_hopper_backward.cpp (dq against the f64 oracle,
// bitwise determinism).
#pragma once

#include <cstdint>

#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/backward/tile_sizes.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/operand_layout.hpp"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/ptx/stmatrix.cuh"

namespace gqattn::hopper::bwd {

// Named barrier of the two consumer warpgroups: both halves of a step's dS
// are in shared memory.
constexpr uint32_t kDsReadyBarrier = ptx::kFirstNamedBarrier;
// By turns (dq_by_turns), per dS buffer b (steps t with t % 2 = b): the
// other warpgroup's half is in it (sent: it arrives, the step's dQ
// warpgroup syncs) and the dQ wgmma that read it has completed (free: the
// dQ warpgroup arrives, the other syncs before writing step t + 2's half).
// The split by gradient's hand-over (dkdv_split_grad.cuh) takes the same
// IDs; it runs only at d = 256, which has no fused dQ.
constexpr uint32_t kDsSentBarrier = kDsReadyBarrier + 1;  // buffer b: + b
constexpr uint32_t kDsFreeBarrier = kDsSentBarrier + 2;   // buffer b: + b
static_assert(kDsFreeBarrier + 1 < ptx::kNamedBarrierCount, "named barrier IDs run out");

// Consumer warps that stage each step's dQ partial (one arrival each on the
// step's dq_full barrier): one warpgroup's by turns, else both's.
constexpr int dq_staging_warps(int d) {
  return dq_by_turns(d) ? kWarpsPerWarpgroup : kBwdConsumerWarps;
}

// Back-off of the dQ writer while it waits for its turn to add (and of the
// conversion tail between rounds without progress); 16 and 256 ns measure
// the same: docs/decisions/hopper-backward-fused-dq.md.
constexpr unsigned kDqSpinNs = 64;

// Stores dS^T of one warpgroup (its 64 keys = rows of `rows`, 64 queries =
// columns) from the 16-bit A fragments `a` (k-step kk: n8 blocks 2kk, 2kk+1;
// a[kk][j] holds row g + 8 (j & 1), columns 16 kk + 8 (j >> 1) + 2t, +1 of
// the warp's 16 rows) into 128-byte rows with the 128-byte swizzle (16-byte
// chunk c of row r at chunk c ^ (r % 8)): the MN-major layout of dS as the
// A operand of dQ = dS K (M = queries contiguous, K = keys along rows),
// i.e. a K-major [64][64] tile (operand_layout.hpp k_major_offset).
// One stmatrix.x4 per k-step, a[kk][j] being exactly the
// register j of accumulator_stmatrix_offset(2 kk, ...) (both are the m16n8
// C / A fragment's pairs; tests/cpu/test_hopper_operand_layout.cpp checks
// that offset); a quarter of the 32-bit stores' instructions, no bank
// conflicts: docs/decisions/hopper-backward-stmatrix-ds.md.
template <int kSteps>
__device__ __forceinline__ void store_ds_rows(uint32_t rows, const uint32_t (&a)[kSteps][4],
                                              int warp, int lane) {
  static_assert(kSteps * kWgmmaK * kElemBytes == kSwizzleBytes, "one 128-byte row of queries");
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    ptx::stmatrix_x4(rows + accumulator_stmatrix_offset(2 * kk, warp, lane, kWgmmaM), a[kk][0],
                     a[kk][1], a[kk][2], a[kk][3]);
}

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
