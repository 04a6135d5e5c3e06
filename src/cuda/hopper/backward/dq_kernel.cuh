// cuda-hopper: the backward's dQ kernel (sm_90a, wgmma, TMA, warp
// specialisation). One CTA of 384 threads per (query tile of 128, head,
// batch) walks the key tiles the mask policy says the tile visits (last
// first), recomputing S and dP there, and accumulates dQ in registers:
//   S = Q K^T, dP = dO V^T               (wgmma SS, N = 64 keys; 32 at
//                                         d 256)
//   P = 2^(v * mult - lse2)              (masked elements 0)
//   dS = P o (dP - D) [o (1 - v^2) under softcap, v before masking]
//   dQ += dS K                           (wgmma RS: dS from the
//                                         accumulators; K MN-major)
// then dQ *= scale and the stores of the rows < Tq (by TMA from a staging
// area over the ring, epilogue.cuh, or plain). Each dQ element is
// one thread's fixed-order sum: deterministic without atomics. Checked
// against the f64 oracle by tests/gpu/test_hopper_backward.cpp.
//
//   warpgroup 0 (producer, setmaxnreg 24): thread 0 loads Q and dO once,
//     then K and V of each visited key tile into a kStages-slot ring;
//   warpgroups 1, 2 (consumers, setmaxnreg 240): 64 query rows each, all
//     d columns (at d 256 128 f32 registers of dQ per thread; DqTile).
//
// Why a separate kernel: the dK/dV kernel would otherwise have to reduce dQ
// across key tiles, through global atomics (not deterministic) or
// FlashAttention-3's semaphore-ordered reduce-adds (the fused dQ, d <= 128,
// which plan.cpp picks per call: docs/decisions/hopper-backward-dq-path.md).
// Recomputing S and dP costs 2 of the backward's 7 GEMMs (vs 5).
//
// Barriers (DqSmem): q_full (count 1, phase 0 only); per slot s full[s]
// (count 1: arrive.expect_tx of the K and V bytes) and empty[s] (count 8:
// lane 0 of every consumer warp after dQ += dS K, the last reader of K, has
// completed). Key tile number `it` (0 for the last visited tile) uses slot
// it % S with parity (it / S) & 1 (S = kStages); the producer waits empty with the
// opposite parity. With no key tile to visit, nothing is loaded or waited
// for and zeros are stored.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/fused/sequence.hpp"
#include "cuda/hopper/backward/common.cuh"
#include "cuda/hopper/backward/epilogue.cuh"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/backward/sequence.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/tma.cuh"
#include "cuda/hopper/ptx/warpgroup.cuh"
#include "cuda/hopper/ptx/wgmma.cuh"
#include "cuda/hopper/ptx/wgmma_ops.cuh"
#include "cuda/hopper/tile_order.hpp"

namespace gqattn::hopper::bwd {

struct DqWork {
  int m0;  // first query row of the tile
  int b, h, hk;
  int tb;  // the tensors' batch coordinate: b, or 0 for a varlen batch's packed tensors
  // Sequence b's rows (fused::Sequence; dense: 0, 0, unused): TMA row
  // coordinates q_row0 + m0 and k_row0 + n0, workspace rows from ws_row0.
  int q_row0, k_row0, ws_row0;
  fused::BlockRange keys;  // walked from keys.last down to keys.first
};

// Longest (last) query tiles first; grouped by pairs measured no faster
// (docs/decisions/hopper-backward-dkdv-grid-groups.md).
__device__ __forceinline__ TileId dq_tile(const fused::BackwardParams& p) {
  const int num_m = int(gridDim.x) / (p.B * p.H);
  return tile_id(TileOrderArgs{p.B, p.H, p.Hkv, num_m, 0}, int(blockIdx.x));
}

// `seq` is backward_sequence(p, id.b) and `mask` its MaskPolicy: a
// query tile at or past the sequence's tq visits no key tile.
template <int kBlockM, int kBlockN, bool kVarlen>
__device__ __forceinline__ DqWork dq_work(const fused::BackwardParams& p, const TileId& id,
                                          const fused::Sequence& seq,
                                          const fused::MaskPolicy& mask) {
  DqWork w;
  w.q_row0 = seq.q_row0;
  w.k_row0 = seq.k_row0;
  w.ws_row0 = seq.ws_row0;
  w.b = id.b;
  w.tb = kVarlen ? 0 : id.b;
  w.h = id.h;
  w.hk = w.h / (p.H / p.Hkv);
  w.m0 = id.m_block * kBlockM;
  w.keys = mask.key_blocks(w.m0, min(kBlockM, mask.tq - w.m0), kBlockN);
  return w;
}

// Run by exactly one thread of the CTA.
template <int kD>
__device__ __forceinline__ void dq_produce(const BackwardParams& p, const DqWork& w,
                                           uint32_t smem) {
  using Tile = DqTile<kD>;
  using L = DqSmem<kD>;
  constexpr int kBN = Tile::kBlockN;
  if (w.keys.last < w.keys.first) return;
  ptx::tma_prefetch(&p.q_map);
  ptx::tma_prefetch(&p.k_map);
  ptx::tma_prefetch(&p.v_map);
  ptx::tma_prefetch(&p.do_map);

  ptx::mbar_arrive_expect_tx(smem + L::kQFull, 2 * L::kQBytes);
  load_rows<kD, Tile::kBlockM>(smem + L::kQ, &p.q_map, smem + L::kQFull, w.q_row0 + w.m0, w.h,
                               w.tb);
  load_rows<kD, Tile::kBlockM>(smem + L::kDo, &p.do_map, smem + L::kQFull, w.q_row0 + w.m0, w.h,
                               w.tb);

  int it = 0;
  for (int n_block = w.keys.last; n_block >= w.keys.first; --n_block, ++it) {
    const int stage = it % Tile::kStages;
    const uint32_t parity = uint32_t(it / Tile::kStages) & 1u;
    const uint32_t full = smem + L::kFull + uint32_t(stage) * L::kBarrierBytes;
    const int n0 = w.k_row0 + n_block * kBN;  // packed row
    ptx::mbar_wait(smem + L::kEmpty + uint32_t(stage) * L::kBarrierBytes, parity ^ 1u);
    ptx::mbar_arrive_expect_tx(full, 2 * L::kKVBytes);
    constexpr int kBox = kv_box_rows(kD);
    load_rows<kD, kBN, kBox>(smem + L::kK + uint32_t(stage) * L::kKVBytes, &p.k_map, full, n0, w.hk,
                             w.tb);
    load_rows<kD, kBN, kBox>(smem + L::kV + uint32_t(stage) * L::kKVBytes, &p.v_map, full, n0, w.hk,
                             w.tb);
  }
}

// Run by all 128 threads of consumer warpgroup `wg` (0 or 1): query rows
// [m0 + 64 wg, m0 + 64 wg + 64), all d columns.
template <int kD, typename Elem, bool kSoftcap, bool kVarlen>
__device__ __forceinline__ void dq_consume(const BackwardParams& p, const DqWork& w,
                                           const fused::MaskPolicy& mask, uint32_t smem, int wg) {
  using Tile = DqTile<kD>;
  using L = DqSmem<kD>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kNT = kBN / 8;            // n8 blocks of S, dP (keys)
  constexpr int kStepsD = kD / kWgmmaK;   // k-steps of S, dP
  constexpr int kStepsN = kBN / kWgmmaK;  // k-steps of dQ
  // S and dP as two wgmma groups (P, under softcap also the factor of 1 -
  // tanh^2, computed while dP runs; overlap_s_dp says where).
  constexpr bool kOverlapSdP = overlap_s_dp(kSoftcap, kD);
  static_assert(kBM == kBwdConsumerWarpgroups * kWgmmaM, "one wgmma M of queries per warpgroup");
  static_assert(Tile::kColsPerWg == kD, "each warpgroup owns all d columns of its rows");

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int wg_row0 = w.m0 + wg * kWgmmaM;
  const int warp_row0 = wg_row0 + warp * fused::kMmaM;
  const uint32_t wg_rows = uint32_t(wg) * kWarpgroupRowBytes;
  const uint32_t q_wg = smem + L::kQ + wg_rows;
  const uint32_t do_wg = smem + L::kDo + wg_rows;
  const fused::BackwardParams& c = p.c;

  // lse2 and D of this thread's rows g and g + 8: inside the workspace
  // block (its rows are a multiple of kBM); +inf and 0 past the sequence's
  // tq.
  int64_t ws = workspace_row<kVarlen>(c, w.b, w.h, w.ws_row0) + warp_row0 + fused::frag_row(lane);
  if constexpr (kVarlen) {
    // A query tile past its sequence's tq visits no key and stores nothing,
    // but its rows may lie past the workspace's end: read the first rows.
    if (w.keys.last < w.keys.first) ws = int64_t(warp_row0 - w.m0) + fused::frag_row(lane);
  }
  const float lse2[2] = {c.lse2[ws], c.lse2[ws + fused::kFragRowHalf]};
  const float dsum[2] = {c.dsum[ws], c.dsum[ws + fused::kFragRowHalf]};

  float dq[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[i][e] = 0.0f;

  if (w.keys.last >= w.keys.first) ptx::mbar_wait(smem + L::kQFull, 0);

  int it = 0;
  for (int n_block = w.keys.last; n_block >= w.keys.first; --n_block, ++it) {
    const int stage = it % Tile::kStages;
    const uint32_t parity = uint32_t(it / Tile::kStages) & 1u;
    const int n0 = n_block * kBN;
    const uint32_t k_tile = smem + L::kK + uint32_t(stage) * L::kKVBytes;
    const uint32_t v_tile = smem + L::kV + uint32_t(stage) * L::kKVBytes;

    // S = Q K^T and dP = dO V^T (first k-steps overwrite): one group, or two
    // when overlapped (S first). Then s <- P, dp <- (dP - D) [* (1 - v^2)];
    // rows are queries (lse2, D of this thread's rows g, g + 8), columns
    // keys.
    float s[1][kNT][4], dp[1][kNT][4];
    uint32_t dsa[kStepsN][4];  // dS as register A operand: k-step kk = n8 blocks 2kk, 2kk+1
    ptx::mbar_wait(smem + L::kFull + uint32_t(stage) * L::kBarrierBytes, parity);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      ptx::Wgmma<kBN, Elem>::ss(s[0], k_major<kBM>(q_wg, kk), k_major<kBN>(k_tile, kk), kk > 0);
    if constexpr (kOverlapSdP) ptx::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      ptx::Wgmma<kBN, Elem>::ss(dp[0], k_major<kBM>(do_wg, kk), k_major<kBN>(v_tile, kk), kk > 0);
    ptx::wgmma_commit();
    // No polynomial in a varlen batch: its vote would see the neighbouring
    // sequences' rows (consumer_mainloop.cuh, kPolyAllowed).
    p_and_dp_minus_d</*kRowsAreKeys=*/false, kSoftcap, kOverlapSdP,
                     bwd_softcap_poly(kD) && !kVarlen>(s, dp, lse2, dsum, c.score, mask, wg_row0,
                                                       warp_row0, n0, lane);

#pragma unroll
    for (int kk = 0; kk < kStepsN; ++kk) ds_to_a<Elem>(dsa[kk], s[0], dp[0], kk);

    // dQ += dS K (K MN-major: N runs along d).
    ptx::pin(dq);
    ptx::pin(dsa);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsN; ++kk)
      ptx::Wgmma<kD, Elem>::rs(dq, dsa[kk], mn_major<kBN>(k_tile, kk), 1);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(dq);
    // Every wgmma of this warpgroup reading the slot has completed.
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(smem + L::kEmpty + uint32_t(stage) * L::kBarrierBytes);
  }

  // Staged and stored by TMA where the gradients allow it:
  // docs/decisions/hopper-backward-gradients-by-tma.md.
  if (p.grads_by_tma) {
    const uint32_t staging = smem + L::kGradStaging + uint32_t(wg) * L::kGradTileBytes;
    staging_acquire();
    stage_rows<kD, Elem, /*kByStmatrix=*/true>(staging, dq, p.dkdq_scale);
    staging_publish();
    if (staged_store_issuer()) {
      store_staged_tile<kD>(&p.dq_map, staging, wg_row0, 0, w.h, w.tb);
      finish_gradient_stores();
    }
    return;
  }
  Elem* dq_out = static_cast<Elem*>(c.dq) + w.tb * c.dq_stride.batch + w.h * c.dq_stride.head +
                 int64_t(w.q_row0) * c.dq_stride.row;
  store_rows<kD, Elem>(dq_out, c.dq_stride.row, warp_row0, mask.tq, c.head_dim, dq, p.dkdq_scale);
}

template <int kD, typename Elem, bool kSoftcap, bool kVarlen>
__global__ void __launch_bounds__(kBwdThreads, 1)
    backward_dq_kernel(const __grid_constant__ BackwardParams p) {
#ifdef GQATTN_HOPPER_BWD_DEVICE_CODE
  using Tile = DqTile<kD>;
  using L = DqSmem<kD>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t smem_unaligned = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (smem_unaligned + kSwizzleAtomBytes - 1) & ~uint32_t(kSwizzleAtomBytes - 1);

  if (threadIdx.x == 0) {
    ptx::mbar_init(smem + L::kQFull, kFullArrivals);
#pragma unroll
    for (int s = 0; s < Tile::kStages; ++s) {
      ptx::mbar_init(smem + L::kFull + uint32_t(s) * L::kBarrierBytes, kFullArrivals);
      ptx::mbar_init(smem + L::kEmpty + uint32_t(s) * L::kBarrierBytes, kEmptyArrivals);
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();

  // One sequence lookup per CTA; producer and consumers share it.
  // A dense batch's mask first, as before varlen (the same code).
  const fused::MaskPolicy batch_mask(p.c.mask);
  const TileId id = dq_tile(p.c);
  const fused::Sequence seq = backward_sequence<kVarlen>(p.c, id.b);
  const fused::MaskPolicy mask = kVarlen ? fused::MaskPolicy(seq.mask) : batch_mask;
  const DqWork w = dq_work<Tile::kBlockM, Tile::kBlockN, kVarlen>(p.c, id, seq, mask);
  const int warpgroup = ptx::warp_uniform(int(threadIdx.x) / kWarpgroupThreads);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kBwdProducerRegisters>();
    if (threadIdx.x == 0) dq_produce<kD>(p, w, smem);
    return;
  }
  ptx::setmaxnreg_inc<kBwdConsumerRegisters>();
  dq_consume<kD, Elem, kSoftcap, kVarlen>(p, w, mask, smem, warpgroup - 1);
#else
  (void)p;
  __trap();  // no sm_90a code in this pass: never launched (see why_not)
#endif
}

}  // namespace gqattn::hopper::bwd
