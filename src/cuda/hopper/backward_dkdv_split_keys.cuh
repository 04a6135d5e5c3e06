// cuda-hopper: the consumer warpgroups of the dK/dV kernel at d = 256
// (DkdvTile::kSplitKeys), FlashAttention-3's layout. The producer, the
// barriers and the work split are backward_dkdv_kernel.cuh's; only what the
// two consumer warpgroups do with a step differs. Checked against the f64
// oracle by tests/gpu/test_hopper_backward.cpp (the d = 256 cases).
//
// Why not the layout of d <= 128: dK and dV of 64 keys x 256 columns would
// take 256 f32 registers per thread. Here the CTA's 64 keys are split two
// ways:
//   S = Q K^T, dP = dO V^T           (wgmma SS m64n32: warpgroup w its keys
//                                     [32 w, 32 w + 32), rows are queries)
//   P = 2^(v * mult - lse2)          (masked elements 0)
//   dS = P o (dP - D) [o (1 - v^2)]  (its own keys only: no element-wise
//                                     work done twice)
//   P, dS -> shared memory           (16-bit [64 queries][64 keys] tiles,
//                                     each warpgroup its 32 columns; then a
//                                     named barrier of both)
//   dV^T += dO^T P, dK^T += Q^T dS   (wgmma SS m64n64, both operands
//                                     MN-major: warpgroup w owns d rows
//                                     [128 w, 128 w + 128) of dK^T, dV^T
//                                     over all 64 keys)
// then dK^T, dV^T go through shared memory (the Q / dO ring, free by then)
// to be stored as rows of keys.
//
// P and dS alternate between two pairs of buffers by step. A warpgroup
// writes step t + 1's pair once its own step t wgmmas have completed; the
// other warpgroup may then still be reading step t's pair, never step t -
// 1's (the one being written): it reached step t's barrier only after its
// step t - 1 reads had completed. The buffers are written by ordinary
// stores and read by wgmma (async proxy), so each writer fences
// (fence.proxy.async) before the barrier.
#pragma once

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/mma.cuh"
#include "cuda/hopper/backward_common.cuh"
#include "cuda/hopper/backward_dkdv_work.cuh"
#include "cuda/hopper/backward_params.hpp"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/wgmma.cuh"
#include "cuda/hopper/ptx/wgmma_ops.cuh"

namespace gqattn::hopper::bwd {

// Named barriers of the two consumer warpgroups: a step's P is whole in
// shared memory (and, once more after the last step, every wgmma read of
// the ring has completed); a step's dS is. This path has neither the fused
// dQ nor the exchange, whose barriers use the same IDs.
constexpr uint32_t kPReadyBarrier = ptx::kFirstNamedBarrier;
constexpr uint32_t kDsReadyBarrierSplitKeys = kPReadyBarrier + 1;
constexpr uint32_t kConsumerThreads = kBwdConsumerWarpgroups * kWarpgroupThreads;

// dK^T and dV^T (this warpgroup's kDBlocks m64 blocks of d rows, times
// `mult`) -> shared memory as rows of keys, [key][d] with kStoreRowBytes
// per row (padded by 16 bytes: a warp's 16-bit stores of one accumulator
// element hit 4 keys x 8 consecutive d, 16 distinct banks).
template <int kD, typename Elem, int kDBlocks, int kNT>
__device__ __forceinline__ void stage_transposed(uint32_t rows,
                                                 const float (&acc)[kDBlocks][kNT][4], int d0,
                                                 int warp, int lane, float mult) {
  constexpr uint32_t kRowBytes = uint32_t(kD) * kElemBytes + 16;
#pragma unroll
  for (int c = 0; c < kDBlocks; ++c)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = d0 + c * kWgmmaM + warp * flash::kMmaM + flash::frag_row(lane) +
                      (e >> 1) * flash::kFragRowHalf;
        const int key = nt * flash::kMmaN + flash::frag_col(lane) + (e & 1);
        const Elem x = cuda::store_as<Elem>(acc[c][nt][e] * mult);
        const uint32_t addr = rows + uint32_t(key) * kRowBytes + uint32_t(d) * kElemBytes;
        asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr),
                     "h"(*reinterpret_cast<const unsigned short*>(&x))
                     : "memory");
      }
}

// Rows [0, kRows) of a [key][d] staging tile (kD + 8 elements a row) to
// `out` + key * row_stride, keys < `rows_end` - `key0` only; two columns per
// 32-bit access, consecutive threads on consecutive words.
template <int kD, int kRows>
__device__ __forceinline__ void copy_out_rows(void* out, int64_t row_stride,
                                              const unsigned char* rows, int key0, int rows_end,
                                              int thread, int threads) {
  constexpr int kWordsPerRow = kD / 2;
  constexpr int kRowBytes = kD * int(kElemBytes) + 16;
  for (int i = thread; i < kRows * kWordsPerRow; i += threads) {
    const int r = i / kWordsPerRow, word = i % kWordsPerRow;
    if (key0 + r >= rows_end) break;  // rows ascend with i
    const uint32_t v = *reinterpret_cast<const uint32_t*>(rows + r * kRowBytes + word * 4);
    *reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(out) +
                                 ((key0 + r) * row_stride + 2 * word) * int64_t(kElemBytes)) = v;
  }
}

// Run by all 128 threads of consumer warpgroup `wg` (0 or 1).
template <int kD, typename Elem, bool kSoftcap>
__device__ __forceinline__ void dkdv_consume_split_keys(const BackwardParams& p, const DkdvWork& w,
                                                        const flash::MaskPolicy& mask,
                                                        uint32_t smem,
                                                        const unsigned char* smem_ptr, int wg) {
  using Tile = DkdvTile<kD>;
  using L = DkdvSmem<kD, false>;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kKeysPerWg = kBN / kBwdConsumerWarpgroups;  // N of S, dP
  constexpr int kNT = kKeysPerWg / flash::kMmaN;            // n8 blocks of S, dP
  constexpr int kStepsD = kD / kWgmmaK;                     // k-steps of S, dP
  constexpr int kStepsKeys = kKeysPerWg / kWgmmaK;          // A-fragment k-steps of P, dS
  constexpr int kStepsM = kBM / kWgmmaK;                    // k-steps of dV^T, dK^T (queries)
  constexpr int kDBlocks = Tile::kColsPerWg / kWgmmaM;      // m64 blocks of dK^T, dV^T rows
  constexpr int kNK = kBN / flash::kMmaN;                   // n8 blocks of dK^T, dV^T (keys)
  static_assert(Tile::kSplitKeys && kBM == kWgmmaM, "one wgmma M of queries per step");
  static_assert(kBN * kElemBytes == kSwizzleBytes, "P, dS rows are one 128-byte swizzle row");
  static_assert(Tile::kColsPerWg % kColBlock == 0, "a warpgroup's d rows are whole column blocks");

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int wg_key0 = w.n0 + wg * kKeysPerWg;
  // This warpgroup's keys of the K / V tile (32 rows into each column block:
  // 4096 bytes, still a multiple of 1024) and its first d column block of a
  // Q / dO tile.
  const uint32_t wg_keys = uint32_t(wg * kKeysPerWg) * kSwizzleBytes;
  const uint32_t k_wg = smem + L::kK + wg_keys;
  const uint32_t v_wg = smem + L::kV + wg_keys;
  const uint32_t wg_cols = uint32_t(wg * kDBlocks) * (kBM * kSwizzleBytes);
  // Its columns of the P / dS rows (16-byte chunks).
  const uint32_t first_chunk = uint32_t(wg * kKeysPerWg) * kElemBytes / 16;

  float dkt[kDBlocks][kNK][4], dvt[kDBlocks][kNK][4];
#pragma unroll
  for (int c = 0; c < kDBlocks; ++c)
#pragma unroll
    for (int i = 0; i < kNK; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dkt[c][i][e] = dvt[c][i][e] = 0.0f;

  if (w.steps > 0) ptx::mbar_wait(smem + L::kKVFull, 0);

  for (int t = 0; t < w.steps; ++t) {
    const int stage = t % Tile::kStages;
    const uint32_t parity = uint32_t(t / Tile::kStages) & 1u;
    const int m0 = w.m0(t, kBM);
    const uint32_t q_tile = smem + L::kQ + uint32_t(stage) * L::kQBytes;
    const uint32_t do_tile = smem + L::kDo + uint32_t(stage) * L::kQBytes;
    const uint32_t p_buf = smem + L::kPds + uint32_t(t & 1) * 2 * L::kPdsBytes;
    const uint32_t ds_buf = p_buf + L::kPdsBytes;

    // S = Q K^T and dP = dO V^T of this warpgroup's keys (two groups, S
    // first, when overlapped); rows are queries, so lse2 and D are those of
    // this thread's rows g, g + 8 of the warp's 16.
    ptx::mbar_wait(smem + L::kFull + uint32_t(stage) * L::kBarrierBytes, parity);
    const int row = warp * flash::kMmaM + flash::frag_row(lane);
    const float* slot_lse2 =
        reinterpret_cast<const float*>(smem_ptr + L::kLse2 + stage * L::kRowBytes);
    const float* slot_dsum =
        reinterpret_cast<const float*>(smem_ptr + L::kDsum + stage * L::kRowBytes);
    const float lse2[2] = {slot_lse2[row], slot_lse2[row + flash::kFragRowHalf]};
    const float dsum[2] = {slot_dsum[row], slot_dsum[row + flash::kFragRowHalf]};
    float s[1][kNT][4], dp[1][kNT][4];
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      ptx::Wgmma<kKeysPerWg, Elem>::ss(s[0], k_major<kBM>(q_tile, kk), k_major<kBN>(k_wg, kk),
                                       kk > 0);
    ptx::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      ptx::Wgmma<kKeysPerWg, Elem>::ss(dp[0], k_major<kBM>(do_tile, kk), k_major<kBN>(v_wg, kk),
                                       kk > 0);
    ptx::wgmma_commit();

    // S has landed; dP may still run. P (and under softcap the factor r -
    // r^2 of dS / 4, p_and_ds_factor) of this warpgroup's keys, into the
    // step's P buffer.
    ptx::wgmma_wait<1>();
    ptx::pin(s[0]);
    const int warp_row0 = m0 + warp * flash::kMmaM;
    [[maybe_unused]] float factor[kNT][4];
    if constexpr (kSoftcap) {
      const float k = kTwoLog2e * p.c.score.pre;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) factor[nt][e] = to_softcap_r(s[0][nt][e], k);
      p_from_scores</*kRowsAreKeys=*/false>(s, lse2, -2.0f * p.c.score.mult, mask, m0, warp_row0,
                                            wg_key0, lane);
    } else {
      p_from_scores</*kRowsAreKeys=*/false>(s, lse2, p.c.score.mult, mask, m0, warp_row0, wg_key0,
                                            lane);
    }
    uint32_t pa[kStepsKeys][4];
#pragma unroll
    for (int kk = 0; kk < kStepsKeys; ++kk)
      flash::acc_to_a<Elem>(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
    store_a_rows(p_buf, pa, warp, lane, first_chunk);
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(kPReadyBarrier, kConsumerThreads);

    // dV^T += dO^T P (A: a column block of the dO tile, M = 64 d contiguous,
    // K = queries along its rows; B: the P tile, N = 64 keys contiguous),
    // running while dS is formed; dvt is not touched until wait_group 0.
#pragma unroll
    for (int c = 0; c < kDBlocks; ++c) ptx::pin(dvt[c]);
    ptx::wgmma_fence();
#pragma unroll
    for (int c = 0; c < kDBlocks; ++c)
#pragma unroll
      for (int kk = 0; kk < kStepsM; ++kk)
        ptx::Wgmma<kBN, Elem>::ss_mn(
            dvt[c], mn_major<kBM>(do_tile + wg_cols + uint32_t(c) * (kBM * kSwizzleBytes), kk),
            mn_major<kBM>(p_buf, kk), 1);
    ptx::wgmma_commit();

    // dP has landed; dV may still run. dS = P o (dP - D) [o factor] into
    // the step's dS buffer.
    ptx::wgmma_wait<1>();
    ptx::pin(dp[0]);
    dp_minus_d</*kRowsAreKeys=*/false>(dp, dsum, lane);
    if constexpr (kSoftcap) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[0][nt][e] *= factor[nt][e];
    }
    uint32_t dsa[kStepsKeys][4];
#pragma unroll
    for (int kk = 0; kk < kStepsKeys; ++kk) ds_to_a<Elem>(dsa[kk], s[0], dp[0], kk);
    store_a_rows(ds_buf, dsa, warp, lane, first_chunk);
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(kDsReadyBarrierSplitKeys, kConsumerThreads);

    // dK^T += Q^T dS, as dV^T.
#pragma unroll
    for (int c = 0; c < kDBlocks; ++c) ptx::pin(dkt[c]);
    ptx::wgmma_fence();
#pragma unroll
    for (int c = 0; c < kDBlocks; ++c)
#pragma unroll
      for (int kk = 0; kk < kStepsM; ++kk)
        ptx::Wgmma<kBN, Elem>::ss_mn(
            dkt[c], mn_major<kBM>(q_tile + wg_cols + uint32_t(c) * (kBM * kSwizzleBytes), kk),
            mn_major<kBM>(ds_buf, kk), 1);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < kDBlocks; ++c) {
      ptx::pin(dvt[c]);
      ptx::pin(dkt[c]);
    }
    // Every wgmma of this warpgroup reading the slot has completed.
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(smem + L::kEmpty + uint32_t(stage) * L::kBarrierBytes);
  }

  // Epilogue: once both warpgroups' reads of the ring have completed (the
  // producer loads nothing past the last step), its Q and dO slots hold dK
  // and dV as [key][d] rows, which all 256 consumer threads then copy out.
  constexpr uint32_t kStoreRowBytes = uint32_t(kD) * kElemBytes + 16;
  constexpr uint32_t kStoreTileBytes = uint32_t(kBN) * kStoreRowBytes;
  static_assert(2 * kStoreTileBytes <= Tile::kStages * 2 * L::kQBytes, "dK, dV fit in the ring");
  const uint32_t dk_rows = smem + L::kQ;
  const uint32_t dv_rows = dk_rows + kStoreTileBytes;
  ptx::named_barrier_sync(kPReadyBarrier, kConsumerThreads);
  const int d0 = wg * Tile::kColsPerWg;
  stage_transposed<kD, Elem>(dk_rows, dkt, d0, warp, lane, p.dkdq_scale);
  stage_transposed<kD, Elem>(dv_rows, dvt, d0, warp, lane, 1.0f);
  ptx::named_barrier_sync(kPReadyBarrier, kConsumerThreads);
  const flash::BackwardParams& c = p.c;
  const int thread = wg * kWarpgroupThreads + int(threadIdx.x) % kWarpgroupThreads;
  copy_out_rows<kD, kBN>(
      static_cast<Elem*>(c.dk) + w.b * c.dk_stride.batch + w.hk * c.dk_stride.head, c.dk_stride.row,
      smem_ptr + L::kQ, w.n0, mask.tk, thread, kConsumerThreads);
  copy_out_rows<kD, kBN>(
      static_cast<Elem*>(c.dv) + w.b * c.dv_stride.batch + w.hk * c.dv_stride.head, c.dv_stride.row,
      smem_ptr + L::kQ + kStoreTileBytes, w.n0, mask.tk, thread, kConsumerThreads);
}

}  // namespace gqattn::hopper::bwd
