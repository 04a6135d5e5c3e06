// cuda-hopper: the backward's dK/dV kernel (sm_90a, wgmma, TMA, warp
// specialisation), which for d <= 128 also forms dQ (the fused dQ). One CTA
// of 384 threads per (key tile of 128, kv head, batch) walks the query tiles
// of every query head of the GQA group that the mask policy says see the
// key tile, so dK and dV are accumulated in registers once per kv head
// (never expanded to H heads in memory) and written once, in a fixed order.
// Checked against the f64 oracle by tests/gpu/test_hopper_backward.cpp.
//
//   warpgroup 0 (producer, setmaxnreg 24): thread 0 loads K, V once, then
//     per step Q, dO (TMA) and lse2, D (bulk copy) into a kStages-slot ring;
//     with the fused dQ, lane 0 of warps 1 .. kDqWriters (alternate steps)
//     move each step's staged dQ partial into the f32 accumulator
//     (backward_dq_writer.cuh dkdv_write_dq: the first key tile stores,
//     the others reduce-add, in an order fixed by semaphores);
//   warpgroups 1, 2 (consumers, setmaxnreg 240): 64 keys each (d 256: the
//     same 64 keys, one forming dV and the other dK,
//     dkdv_split_grad.cuh), per step
//     S^T = K Q^T, dP^T = V dO^T        (wgmma SS, N = 64 queries)
//     P^T = 2^(v * mult - lse2)          (masked elements 0)
//     dS^T = P^T o (dP^T - D) [o (1 - v^2) under softcap, v before masking]
//     dV += P^T dO, dK += dS^T Q         (wgmma RS: P^T, dS^T straight from
//                                         the accumulators; dO, Q MN-major;
//                                         dV issued before dS^T is formed)
//     fused dQ: dS^T to shared memory; once both warpgroups have written
//     theirs (named barrier), dQ_part = dS K (wgmma SS, both operands
//     MN-major, issued before dK's), half of d per warpgroup, staged in
//     shared memory while dK's wgmma runs; or by turns (dq_by_turns, d 64):
//     warpgroup t % 2 forms all of step t's dQ_part once its dV and dK have
//     completed and the other warpgroup has handed over its half of dS^T
//     (which then goes on without waiting: dkdv_finish_step_dq_by_turns);
//   then dK *= scale and the stores of the rows < Tk (by TMA from a staging
//   area over the ring, epilogue.cuh, or plain).
//
// Barriers (DkdvSmem): kv_full (count 1, phase 0 only); per slot s full[s]
// (count 1: the producer's arrive.expect_tx of Q + dO + lse2 + D bytes) and
// empty[s] (count 8: lane 0 of every consumer warp after the step's last
// wgmma has completed). Step t uses slot t % S with parity (t / S) & 1 (S = kStages); the
// producer waits empty with the opposite parity (its first pass through the
// ring does not block). Fused dQ: dq_full[t % kDqWriters] (count 8,
// consumer warps; its writer waits parity (t / kDqWriters) & 1) and one
// dq_empty (count 1, whichever writer read step t; the consumers wait parity
// (t & 1) ^ 1 before staging step t); by turns dq_full counts the 4 warps of
// the staging warpgroup, and each staging buffer b has its dq_empty[b]
// (warpgroup b waits parity ((t / 2) & 1) ^ 1), the dS hand-over named
// barriers (backward_dq_fused.cuh kDsSentBarrier, kDsFreeBarrier) replace
// the per-step one, and a warpgroup releases its ring slot before its dQ
// wgmma, which reads only dS and K. Producer, writer and
// consumers derive the same steps from the same MaskPolicy; with no step,
// nothing is loaded or waited for and zeros are stored. Shared memory is
// written by TMA/bulk copies (async proxy) and read by wgmma (async proxy)
// or, for lse2 / D, by ordinary loads after the full barrier's wait; the
// dS and dQ staging buffers are written by ordinary stores and then read by
// the async proxy, so each writer fences (fence.proxy.async) before the
// barrier that hands them over.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/hopper/backward/common.cuh"
#include "cuda/hopper/backward/dkdv_split_grad.cuh"
#include "cuda/hopper/backward/dkdv_work.cuh"
#include "cuda/hopper/backward/dq_fused.cuh"
#include "cuda/hopper/backward/dq_writer.cuh"
#include "cuda/hopper/backward/epilogue.cuh"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/ptx/bulk_copy.cuh"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/grid_dependency.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/tma.cuh"
#include "cuda/hopper/ptx/warpgroup.cuh"
#include "cuda/hopper/ptx/wgmma.cuh"
#include "cuda/hopper/ptx/wgmma_ops.cuh"

namespace gqattn::hopper::bwd {

// Run by exactly one thread of the CTA.
template <int kD, bool kFusedDq, bool kVarlen>
__device__ __forceinline__ void dkdv_produce(const BackwardParams& p, const DkdvWork& w,
                                             uint32_t smem) {
  using Tile = DkdvTile<kD>;
  using L = DkdvSmem<kD, kFusedDq>;
  constexpr int kBM = Tile::kBlockM;
  if (w.steps == 0) return;
  ptx::tma_prefetch(&p.q_map);
  ptx::tma_prefetch(&p.k_map);
  ptx::tma_prefetch(&p.v_map);
  ptx::tma_prefetch(&p.do_map);

  ptx::mbar_arrive_expect_tx(smem + L::kKVFull, 2 * L::kKVBytes);
  constexpr int kBox = kv_box_rows(kD);
  load_rows<kD, Tile::kBlockN, kBox>(smem + L::kK, &p.k_map, smem + L::kKVFull, w.k_row0 + w.n0,
                                     w.hk, w.tb);
  load_rows<kD, Tile::kBlockN, kBox>(smem + L::kV, &p.v_map, smem + L::kKVFull, w.k_row0 + w.n0,
                                     w.hk, w.tb);

  for (int t = 0; t < w.steps; ++t) {
    const int stage = t % Tile::kStages;
    const uint32_t parity = uint32_t(t / Tile::kStages) & 1u;
    const uint32_t full = smem + L::kFull + uint32_t(stage) * L::kBarrierBytes;
    const int h = w.head(t);
    const int m0 = w.m0(t, kBM);
    ptx::mbar_wait(smem + L::kEmpty + uint32_t(stage) * L::kBarrierBytes, parity ^ 1u);
    ptx::mbar_arrive_expect_tx(full, L::kStageTxBytes);
    load_rows<kD, kBM>(smem + L::kQ + uint32_t(stage) * L::kQBytes, &p.q_map, full, w.q_row0 + m0,
                       h, w.tb);
    load_rows<kD, kBM>(smem + L::kDo + uint32_t(stage) * L::kQBytes, &p.do_map, full, w.q_row0 + m0,
                       h, w.tb);
    // Workspace rows of (b, h), queries m0 .. m0 + kBM - 1: inside the
    // block (its rows are a multiple of 128 >= m0 + kBM) and 256-byte
    // aligned (the block starts at a multiple of 128 rows).
    const int64_t ws = workspace_row<kVarlen>(p.c, w.b, h, w.ws_row0) + m0;
    ptx::bulk_load(smem + L::kLse2 + uint32_t(stage) * L::kRowBytes, p.c.lse2 + ws, L::kRowBytes,
                   full);
    ptx::bulk_load(smem + L::kDsum + uint32_t(stage) * L::kRowBytes, p.c.dsum + ws, L::kRowBytes,
                   full);
  }
}

// Fused dQ: this warpgroup's columns of one step's partial dS K, committed
// as one wgmma group. A is the step's dS buffer (both warpgroups' keys), B
// the warpgroup's columns of the K tile (k_dq_cols; by turns, all of them:
// the tile itself), both MN-major.
template <int kD, typename Elem>
__device__ __forceinline__ void issue_dq_partial(float (&dq)[DkdvTile<kD>::kDqCols / 8][4],
                                                 uint32_t ds_buf, uint32_t k_dq_cols) {
  constexpr int kBN = DkdvTile<kD>::kBlockN;
#pragma unroll
  for (int kk = 0; kk < kBN / kWgmmaK; ++kk)
    ptx::Wgmma<DkdvTile<kD>::kDqCols, Elem>::ss_mn(dq, mn_major<kBN>(ds_buf, kk),
                                                   mn_major<kBN>(k_dq_cols, kk), kk > 0);
  ptx::wgmma_commit();
}

// Fused dQ in lockstep: stages this warpgroup's half of step t's partial
// (complete in dq) once the writer has read step t - 1's, fences it for the
// bulk copy and announces it to step t's writer.
template <int kD>
__device__ __forceinline__ void stage_dq_partial(uint32_t smem,
                                                 const float (&dq)[DkdvTile<kD>::kDqCols / 8][4],
                                                 int wg, int t, int lane) {
  using L = DkdvSmem<kD, true>;
  ptx::mbar_wait(smem + L::kDqEmpty, uint32_t(t & 1) ^ 1u);
  stage_dq<DkdvTile<kD>::kDqCols>(smem + L::kDqStage + uint32_t(wg) * (L::kDqStageBytes / 2), dq);
  ptx::fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) ptx::mbar_arrive(smem + L::kDqFull + uint32_t(t % kDqWriters) * L::kBarrierBytes);
}

// Fused dQ by turns (dq_by_turns): the rest of step t once dS^T is packed
// (dsa; dV's wgmma already committed). Both warpgroups put their dS^T rows
// into the step's buffer and run dK; warpgroup t % 2 then waits for the
// other's half, forms the step's whole dQ partial dS K (A the dS buffer, B the K tile, both
// MN-major; N = d) once its dV and dK have completed, so that its registers hold dK, dV and dQ
// only, and stages it for the writers. The other warpgroup arrives and
// moves on, so the two are no longer tied together every step (they may
// drift up to about a step apart; how far they do is not measured), and
// one's element-wise work can run while the other's GEMMs do.
template <int kD, typename Elem, int kStepsM>
__device__ __forceinline__ void dkdv_finish_step_dq_by_turns(
    const DkdvWork& w, uint32_t smem, uint32_t q_tile, uint32_t ds_buf, int stage, int t, int wg,
    int warp, int lane, const uint32_t (&dsa)[kStepsM][4], float (&dv)[kD / 8][4],
    float (&dk)[kD / 8][4]) {
  using Tile = DkdvTile<kD>;
  using L = DkdvSmem<kD, true>;
  constexpr int kBM = Tile::kBlockM;
  constexpr uint32_t kPairThreads = kBwdConsumerWarpgroups * kWarpgroupThreads;
  static_assert(Tile::kDqCols == kD, "by turns: whole rows of d");
  const bool dq_turn = (t & 1) == wg;  // warpgroup-uniform
  const uint32_t buffer = uint32_t(t & 1);
  const uint32_t wg_rows = uint32_t(wg) * kWarpgroupRowBytes;
  // This warpgroup last wrote the buffer at step t - 2; if that was the
  // other's dQ step, its wgmma must have read the buffer.
  if (!dq_turn && t >= 2) ptx::named_barrier_sync(kDsFreeBarrier + buffer, kPairThreads);
  store_ds_rows(ds_buf + wg_rows, dsa, warp, lane);
  ptx::fence_proxy_async_shared();
  if (!dq_turn) ptx::named_barrier_arrive(kDsSentBarrier + buffer, kPairThreads);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kStepsM; ++kk)
    ptx::Wgmma<kD, Elem>::rs(dk, dsa[kk], mn_major<kBM>(q_tile, kk), 1);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::pin(dv);
  ptx::pin(dk);
  // Every wgmma of this warpgroup reading the slot has completed (dQ reads
  // only the dS buffer and K).
  __syncwarp();
  if (lane == 0) ptx::mbar_arrive(smem + L::kEmpty + uint32_t(stage) * L::kBarrierBytes);
  if (!dq_turn) return;

  // Both halves of dS^T are in the buffer: the other warpgroup's (fenced
  // before its arrival) and this one's (fenced by each of its threads).
  ptx::named_barrier_sync(kDsSentBarrier + buffer, kPairThreads);
  float dq[kD / 8][4];
  ptx::wgmma_fence();
  issue_dq_partial<kD, Elem>(dq, ds_buf, smem + L::kK);
  ptx::wgmma_wait<0>();
  ptx::pin(dq);
  if (t + 2 < w.steps) ptx::named_barrier_arrive(kDsFreeBarrier + buffer, kPairThreads);
  // Stage the partial once the writer has read this warpgroup's previous one
  // (buffer t % 2 holds steps t - 2, t: phase parity (t / 2) & 1).
  ptx::mbar_wait(smem + L::kDqEmpty + buffer * L::kBarrierBytes, uint32_t((t >> 1) & 1) ^ 1u);
  stage_dq<kD>(smem + L::kDqStage + buffer * L::kDqStageBytes, dq);
  ptx::fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) ptx::mbar_arrive(smem + L::kDqFull + uint32_t(t % kDqWriters) * L::kBarrierBytes);
}

// Run by all 128 threads of consumer warpgroup `wg` (0 or 1): keys
// [n0 + 64 wg, n0 + 64 wg + 64), all d columns.
// kPoly: the polynomial tanh (bwd_softcap_poly), never in a varlen batch
// (forward/consumer_mainloop.cuh, kPolyAllowed, says why).
template <int kD, typename Elem, bool kSoftcap, bool kFusedDq, bool kPoly>
__device__ __forceinline__ void dkdv_consume(const BackwardParams& p, const DkdvWork& w,
                                             const fused::MaskPolicy& mask, uint32_t smem,
                                             const unsigned char* smem_ptr, int wg) {
  using Tile = DkdvTile<kD>;
  using L = DkdvSmem<kD, kFusedDq>;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kNT = kBM / 8;            // n8 blocks of S^T, dP^T (queries)
  constexpr int kStepsD = kD / kWgmmaK;   // k-steps of S^T, dP^T
  constexpr int kStepsM = kBM / kWgmmaK;  // k-steps of dV, dK
  // S^T and dP^T as two wgmma groups (P^T, under softcap also the factor
  // of 1 - tanh^2, computed while dP^T runs; overlap_s_dp says where).
  constexpr bool kOverlapSdP = overlap_s_dp(kSoftcap, kD);
  static_assert(kBN == kBwdConsumerWarpgroups * kWgmmaM, "one wgmma M of keys per warpgroup");
  static_assert(Tile::kColsPerWg == kD, "each warpgroup owns all d columns of its keys");

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int wg_key0 = w.n0 + wg * kWgmmaM;
  const int warp_key0 = wg_key0 + warp * fused::kMmaM;
  const uint32_t wg_rows = uint32_t(wg) * kWarpgroupRowBytes;
  const uint32_t k_wg = smem + L::kK + wg_rows;
  const uint32_t v_wg = smem + L::kV + wg_rows;
  // Fused dQ: this warpgroup's dQ columns [wg kDqCols, (wg + 1) kDqCols) of
  // the K tile as an MN-major B operand (N along d): a whole column block
  // for d 128; for d 64 half of one (32 columns = 64 bytes into the
  // 128-byte row: the swizzle acts on the final address, as for the
  // 32-byte k-steps of K-major operands).
  constexpr int kDqCols = Tile::kDqCols;
  [[maybe_unused]] const uint32_t k_dq_cols =
      smem + L::kK + uint32_t(wg * kDqCols / kColBlock) * (kBN * kSwizzleBytes) +
      uint32_t(wg * kDqCols % kColBlock) * kElemBytes;

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;

  if (w.steps > 0) ptx::mbar_wait(smem + L::kKVFull, 0);

  for (int t = 0; t < w.steps; ++t) {
    const int stage = t % Tile::kStages;
    const uint32_t parity = uint32_t(t / Tile::kStages) & 1u;
    const int m0 = w.m0(t, kBM);
    const uint32_t q_tile = smem + L::kQ + uint32_t(stage) * L::kQBytes;
    const uint32_t do_tile = smem + L::kDo + uint32_t(stage) * L::kQBytes;
    const float* lse2 = reinterpret_cast<const float*>(smem_ptr + L::kLse2 + stage * L::kRowBytes);
    const float* dsum = reinterpret_cast<const float*>(smem_ptr + L::kDsum + stage * L::kRowBytes);

    // S^T = K Q^T and dP^T = V dO^T (first k-steps overwrite): one group, or
    // two when overlapped (S^T first). Then s <- P^T, dp <- (dP^T - D)
    // [* (1 - v^2)]; rows are keys, columns queries (lse2, D per column,
    // from the step's slot).
    float s[1][kNT][4], dp[1][kNT][4];
    // P^T and dS^T as register A operands: k-step kk = n8 blocks 2kk, 2kk+1.
    uint32_t pa[kStepsM][4], dsa[kStepsM][4];
    ptx::mbar_wait(smem + L::kFull + uint32_t(stage) * L::kBarrierBytes, parity);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      ptx::Wgmma<kBM, Elem>::ss(s[0], k_major<kBN>(k_wg, kk), k_major<kBM>(q_tile, kk), kk > 0);
    if constexpr (kOverlapSdP) ptx::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      ptx::Wgmma<kBM, Elem>::ss(dp[0], k_major<kBN>(v_wg, kk), k_major<kBM>(do_tile, kk), kk > 0);
    ptx::wgmma_commit();
    p_and_dp_minus_d</*kRowsAreKeys=*/true, kSoftcap, kOverlapSdP, kPoly>(
        s, dp, lse2, dsum, p.c.score, mask, wg_key0, warp_key0, m0, lane);

    // dV += P^T dO, then dK += dS^T Q (B operands MN-major: N runs along
    // d). The dV group is issued before dS^T is formed and runs while it
    // is (docs/decisions/hopper-backward-overlap-dv.md); pa and dv are not
    // touched until wait_group 0.
#pragma unroll
    for (int kk = 0; kk < kStepsM; ++kk)
      fused::acc_to_a<Elem>(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
    ptx::pin(dv);
    ptx::pin(dk);
    ptx::pin(pa);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsM; ++kk)
      ptx::Wgmma<kD, Elem>::rs(dv, pa[kk], mn_major<kBM>(do_tile, kk), 1);
    ptx::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kStepsM; ++kk) ds_to_a<Elem>(dsa[kk], s[0], dp[0], kk);
    ptx::pin(dsa);
    [[maybe_unused]] const uint32_t ds_buf = smem + L::kDs + uint32_t(t & 1) * L::kDsBytes;
    if constexpr (kFusedDq && Tile::kDqByTurns) {
      dkdv_finish_step_dq_by_turns<kD, Elem>(w, smem, q_tile, ds_buf, stage, t, wg, warp, lane, dsa,
                                             dv, dk);
      continue;
    }
    [[maybe_unused]] float dq[kDqCols / 8][4];
    if constexpr (kFusedDq) {
      // This warpgroup's dS^T rows into the step's dS buffer, fenced for the
      // async proxy (wgmma) that reads it; once both warpgroups have written
      // theirs, dQ's wgmma may start.
      store_ds_rows(ds_buf + wg_rows, dsa, warp, lane);
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(kDsReadyBarrier, kBwdConsumerWarpgroups * kWarpgroupThreads);
    }
    ptx::wgmma_fence();
    // The dQ partial of the step's queries before dK, so that it is staged
    // while dK's wgmma runs.
    if constexpr (kFusedDq) issue_dq_partial<kD, Elem>(dq, ds_buf, k_dq_cols);
#pragma unroll
    for (int kk = 0; kk < kStepsM; ++kk)
      ptx::Wgmma<kD, Elem>::rs(dk, dsa[kk], mn_major<kBM>(q_tile, kk), 1);
    ptx::wgmma_commit();
    if constexpr (kFusedDq) {
      // The dV and dQ groups have completed; dK's may still run.
      ptx::wgmma_wait<1>();
      ptx::pin(dq);
      stage_dq_partial<kD>(smem, dq, wg, t, lane);
    }
    ptx::wgmma_wait<0>();
    ptx::pin(dv);
    ptx::pin(dk);
    // Every wgmma of this warpgroup reading the slot has completed.
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(smem + L::kEmpty + uint32_t(stage) * L::kBarrierBytes);
  }

  // Staged and stored by TMA where the gradients allow it:
  // docs/decisions/hopper-backward-gradients-by-tma.md.
  if (p.grads_by_tma) {
    const uint32_t dk_staging = smem + L::kGradStaging + uint32_t(2 * wg) * L::kGradTileBytes;
    const uint32_t dv_staging = dk_staging + L::kGradTileBytes;
    staging_acquire();
    stage_rows<kD, Elem, /*kByStmatrix=*/true>(dk_staging, dk, p.dkdq_scale);
    stage_rows<kD, Elem, /*kByStmatrix=*/true>(dv_staging, dv, 1.0f);
    staging_publish();
    if (staged_store_issuer()) {
      store_staged_tile<kD>(&p.dk_map, dk_staging, wg_key0, 0, w.hk, w.tb);
      store_staged_tile<kD>(&p.dv_map, dv_staging, wg_key0, 0, w.hk, w.tb);
      finish_gradient_stores();
    }
    return;
  }
  const fused::BackwardParams& c = p.c;
  // Keys up to k_rows: a varlen sequence's rows past seqused_k get zeros.
  Elem* dk_out = static_cast<Elem*>(c.dk) + w.tb * c.dk_stride.batch + w.hk * c.dk_stride.head +
                 int64_t(w.k_row0) * c.dk_stride.row;
  Elem* dv_out = static_cast<Elem*>(c.dv) + w.tb * c.dv_stride.batch + w.hk * c.dv_stride.head +
                 int64_t(w.k_row0) * c.dv_stride.row;
  store_rows<kD, Elem>(dk_out, c.dk_stride.row, warp_key0, w.k_rows, c.head_dim, dk, p.dkdq_scale);
  store_rows<kD, Elem>(dv_out, c.dv_stride.row, warp_key0, w.k_rows, c.head_dim, dv, 1.0f);
}

template <int kD, typename Elem, bool kSoftcap, bool kFusedDq, bool kVarlen>
__global__ void __launch_bounds__(kBwdThreads, 1)
    backward_dkdv_kernel(const __grid_constant__ BackwardParams p) {
#ifdef GQATTN_HOPPER_BWD_DEVICE_CODE
  using Tile = DkdvTile<kD>;
  using L = DkdvSmem<kD, kFusedDq>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzled tiles need 1024-byte alignment (DkdvSmem allots the slack).
  const uint32_t smem_unaligned = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (smem_unaligned + kSwizzleAtomBytes - 1) & ~uint32_t(kSwizzleAtomBytes - 1);
  const unsigned char* smem_ptr = smem_raw + (smem - smem_unaligned);

  if (threadIdx.x == 0) {
    ptx::mbar_init(smem + L::kKVFull, kFullArrivals);
#pragma unroll
    for (int s = 0; s < Tile::kStages; ++s) {
      ptx::mbar_init(smem + L::kFull + uint32_t(s) * L::kBarrierBytes, kFullArrivals);
      ptx::mbar_init(smem + L::kEmpty + uint32_t(s) * L::kBarrierBytes, kEmptyArrivals);
    }
    if constexpr (kFusedDq) {
#pragma unroll
      for (int i = 0; i < kDqWriters; ++i)
        ptx::mbar_init(smem + L::kDqFull + uint32_t(i) * L::kBarrierBytes, dq_staging_warps(kD));
#pragma unroll
      for (int b = 0; b < L::kDqStageBuffers; ++b)
        ptx::mbar_init(smem + L::kDqEmpty + uint32_t(b) * L::kBarrierBytes, 1);
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();

  // The fused dQ's conversion kernel may be scheduled once every dK/dV CTA
  // has got here: it checks per block that the adds it reads have completed
  // (docs/decisions/hopper-backward-dq-convert-overlap.md).
  if constexpr (kFusedDq) ptx::launch_dependents();

  // One sequence lookup per CTA; producer, writers and consumers share it.
  // A dense batch's mask first, as before varlen (the same code).
  const fused::MaskPolicy batch_mask(p.c.mask);
  const KeyTileId id = dkdv_tile<Tile::kBlockN, Tile::kBlockM>(p.c, p.dkdv_group_pairs);
  const fused::Sequence seq = backward_sequence<kVarlen>(p.c, id.b);
  const fused::MaskPolicy mask = kVarlen ? fused::MaskPolicy(seq.mask) : batch_mask;
  const DkdvWork w = dkdv_work<Tile::kBlockN, Tile::kBlockM, kVarlen>(p.c, id, seq, mask);
  const int warpgroup = ptx::warp_uniform(int(threadIdx.x) / kWarpgroupThreads);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kBwdProducerRegisters>();
    if (threadIdx.x == 0) dkdv_produce<kD, kFusedDq, kVarlen>(p, w, smem);
    // Writers: lane 0 of warps 1 .. kDqWriters (warp 0 is the producer's).
    if constexpr (kFusedDq) {
      static_assert(kDqWriters >= 1 && kDqWriters < kWarpgroupThreads / kWarpSize,
                    "one producer-warpgroup warp per dQ writer");
      const int warp = int(threadIdx.x) / kWarpSize;
      if (threadIdx.x % kWarpSize == 0 && warp >= 1 && warp <= kDqWriters)
        dkdv_write_dq<kD, kVarlen>(p, w, mask, smem, warp - 1);
    }
    return;
  }
  ptx::setmaxnreg_inc<kBwdConsumerRegisters>();
  if constexpr (Tile::kSplitGradients) {
    static_assert(!kFusedDq, "no fused dQ with the split by gradient");
    dkdv_consume_split_grad<kD, Elem, kSoftcap, bwd_softcap_poly(kD) && !kVarlen>(
        p, w, mask, smem, smem_ptr, warpgroup - 1);
  } else {
    dkdv_consume<kD, Elem, kSoftcap, kFusedDq, bwd_softcap_poly(kD) && !kVarlen>(
        p, w, mask, smem, smem_ptr, warpgroup - 1);
  }
#else
  (void)p;
  __trap();  // no sm_90a code in this pass: never launched (see why_not)
#endif
}

}  // namespace gqattn::hopper::bwd
