// cuda-hopper: a consumer warpgroup's main loop: for each key tile the
// producer delivers, S = Q K^T on wgmma (both operands from shared memory),
// softcap and mask (cuda-flash's policy), online softmax (cuda-flash's), then
// O += P V on wgmma with P from registers. Checked against the f64 oracle by
// tests/gpu/test_hopper_forward.cpp.
//
// Operand layouts in shared memory (128-byte swizzle, tiles 1024-aligned,
// descriptor base offset 0):
// - Q and K, K-major: each 64-column block is [rows][128 B]; a k16 step
//   moves 32 bytes along a row, every 4 steps the next block (rows * 128 B
//   further); 8-row groups are 1024 bytes apart (SBO); LBO is unused.
// - V as the B operand of P V is MN-major (d contiguous): a k16 step is 16
//   key rows (2048 bytes); 8-row groups (K direction) are 1024 bytes apart
//   (SBO) and the next 64 columns of d (N direction) a whole block,
//   kBlockN * 128 bytes, further (LBO).
//
// Invariants: accumulators are read only after wgmma_wait<0> and pin(); a
// slot is released (one arrival per consumer warp) only after the MMAs that
// read it have completed. TODO(perf): one wgmma group in flight at a time;
// intra-warpgroup overlap (softmax of tile n while S of tile n-1 runs) and
// ping-pong scheduling between the two warpgroups are not done yet.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/flash/mask.cuh"
#include "cuda/flash/mma.cuh"
#include "cuda/flash/softmax.cuh"
#include "cuda/hopper/params.hpp"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/wgmma.cuh"
#include "cuda/hopper/ptx/wgmma_ops.cuh"
#include "cuda/hopper/tile_coord.cuh"
#include "cuda/hopper/tile_sizes.hpp"

namespace gqattn::hopper {

constexpr uint32_t kKStepBytes = kWgmmaK * kElemBytes;       // 32: one k16 step along a row
constexpr uint32_t kStepsPerColBlock = kColBlock / kWgmmaK;  // 4
constexpr uint32_t kRowGroupBytes = kSwizzleAtomBytes;       // SBO: 8 rows x 128 B
constexpr uint32_t kUnusedLbo = 16;                          // K-major swizzled: ignored
constexpr uint32_t kVStepBytes = kWgmmaK * kSwizzleBytes;    // 16 key rows of V

// Descriptor of k-step kk of a K-major [rows x kD] tile at `tile`.
template <int kRows>
__device__ __forceinline__ uint64_t k_major_desc(uint32_t tile, int kk) {
  const uint32_t addr = tile +
                        uint32_t(kk) / kStepsPerColBlock * (uint32_t(kRows) * kSwizzleBytes) +
                        uint32_t(kk) % kStepsPerColBlock * kKStepBytes;
  return ptx::make_desc_sw128(addr, kUnusedLbo, kRowGroupBytes);
}

// Descriptor of k-step kk (keys 16 kk..16 kk + 15) of the MN-major V tile.
template <int kBN>
__device__ __forceinline__ uint64_t v_desc(uint32_t tile, int kk) {
  return ptx::make_desc_sw128(tile + uint32_t(kk) * kVStepBytes, uint32_t(kBN) * kSwizzleBytes,
                              kRowGroupBytes);
}

// The result of a consumer warpgroup: its O rows (normalised) and their lse.
template <int kD>
struct ConsumerResult {
  float o[1][kD / 8][4];
  float lse[2];  // rows g and g + 8 of this warp's 16 rows
};

// Run by all 128 threads of consumer warpgroup `wg` (0 or 1), which owns
// query rows [64 wg, 64 wg + 64) of the tile.
template <int kD, typename Elem, bool kSoftcap>
__device__ __forceinline__ void consume(const ForwardParams& p, const TileCoord& tile,
                                        const MaskPolicy& mask, uint32_t smem, int wg,
                                        ConsumerResult<kD>& out) {
  using Tile = ForwardTile<kD>;
  using L = SmemLayout<kD>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kStages = Tile::kStages;
  constexpr int kNT = kBN / 8;  // n8 blocks of S
  constexpr int kStepsQK = kD / kWgmmaK;
  constexpr int kStepsPV = kBN / kWgmmaK;
  static_assert(kBM == kConsumerWarpgroups * kWgmmaM, "one wgmma M per consumer warpgroup");

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int wg_row0 = tile.m0 + wg * kWgmmaM;  // first query row of this warpgroup
  const int warp_row0 = wg_row0 + warp * flash::kMmaM;
  const uint32_t q_tile = smem + L::kQ + uint32_t(wg) * kWgmmaM * kSwizzleBytes;

  auto& o = out.o;
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][i][e] = 0.0f;
  flash::OnlineSoftmax<1> softmax(p.score.mult);

  ptx::mbar_wait(smem + L::kQFull, 0);

  int it = 0;
  for (int n_block = tile.keys.last; n_block >= tile.keys.first; --n_block, ++it) {
    const int stage = it % kStages;
    const uint32_t parity = uint32_t(it / kStages) & 1u;
    const uint32_t bar_off = uint32_t(stage) * L::kBarrierBytes;
    const uint32_t k_tile = smem + L::kK + uint32_t(stage) * L::kKVBytes;
    const uint32_t v_tile = smem + L::kV + uint32_t(stage) * L::kKVBytes;
    const int n0 = n_block * kBN;

    // S = Q K^T (the first k-step overwrites S).
    float s[1][kNT][4];
    ptx::mbar_wait(smem + L::kKFull + bar_off, parity);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsQK; ++kk)
      ptx::Wgmma<kBN, Elem>::ss(s[0], k_major_desc<kBM>(q_tile, kk), k_major_desc<kBN>(k_tile, kk),
                                kk > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(s[0]);
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(smem + L::kKEmpty + bar_off);

    if constexpr (kSoftcap) flash::apply_softcap(s, p.score.pre);
    if (!mask.fully_kept(wg_row0, kWgmmaM, n0, kBN))
      mask.apply</*kRowsAreKeys=*/false>(s, warp_row0, n0, lane, -INFINITY);
    softmax.update(s, o);

    // P as the register A operand: k-step kk is S's n8 blocks 2kk, 2kk+1.
    uint32_t pa[kStepsPV][4];
#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk)
      flash::acc_to_a<Elem>(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);

    // O += P V.
    ptx::mbar_wait(smem + L::kVFull + bar_off, parity);
    ptx::pin(o[0]);
    ptx::pin(pa);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk)
      ptx::Wgmma<kD, Elem>::rs(o[0], pa[kk], v_desc<kBN>(v_tile, kk), 1);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(o[0]);
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(smem + L::kVEmpty + bar_off);
  }

  softmax.finalize(o, out.lse);
}

}  // namespace gqattn::hopper
