// cuda-hopper: the consumer warpgroups of the dK/dV kernel at d = 256 split
// by gradient (DkdvTile::kSplitGradients): warpgroup 0 owns dV, warpgroup 1
// dK, each for all 64 keys of the CTA and all 256 columns (128 f32
// registers per thread). The producer, the barriers of the ring and the
// work split are dkdv_kernel.cuh's. Checked against the f64 oracle
// by tests/gpu/test_hopper_backward.cpp (the d = 256 cases).
//
// Per step (rows are keys, columns the step's 64 queries):
//   warpgroup 0: S^T = K Q^T (wgmma SS), P^T = 2^(v * mult - lse2) (masked
//     elements 0); hands P^T, under softcap P^T o (r - r^2) (the factor of
//     dS / 4, p_and_ds_factor), to warpgroup 1 as f32; dV += P^T dO (wgmma
//     RS, N = 256, dO MN-major);
//   warpgroup 1: dP^T = V dO^T (wgmma SS), dP^T - D; takes the hand-over;
//     dS^T = hand-over o (dP^T - D); dK += dS^T Q (wgmma RS, N = 256).
// Warpgroup 1 waits for warpgroup 0 every step, never the other way round
// (but for the buffer reuse below), so warpgroup 0 runs ahead by up to a
// step and its wgmmas fill the tensor pipe while warpgroup 1 forms dS, and
// the other way round.
//
// The hand-over alternates between two buffers by step (16 KB each). Both
// warpgroups hold the same (row, column) elements in the same fragment
// layout, so thread i of warpgroup 1 reads exactly what thread i of
// warpgroup 0 wrote: 16-byte group j of thread i at (j * 128 + i) * 16
// bytes (a warp's 32 groups are 512 contiguous bytes: no bank conflicts).
// Named barriers, 256 threads:
//   sent[b]  warpgroup 0 has written buffer b: it arrives (bar.arrive, no
//            wait), warpgroup 1 syncs before reading;
//   free[b]  warpgroup 1 has read buffer b: it arrives after its read of
//            step t when step t + 2 exists, and warpgroup 0 syncs before
//            writing step t + 2 into the same buffer.
// Every phase has 128 + 128 threads and none is left open at exit. An
// arriving thread's earlier shared-memory accesses are performed relative
// to the barrier's participants once it completes (PTX ISA, barrier.cta:
// the same for .arrive as for .sync, with a producer / consumer example of
// exactly this shape); the writer must not wait, or warpgroup 0 could not
// run ahead. compute-sanitizer racecheck (two d256 cases, one under
// softcap) reports no hazard on the hand-over, only its known artefact on
// the lse2 / D bulk copies (ordered by the ring's mbarriers, which it does
// not model for bulk copies; tests/probes/bulk_copy_ring.cu shows the same
// on the bare pattern).
#pragma once

#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/hopper/backward/common.cuh"
#include "cuda/hopper/backward/dkdv_work.cuh"
#include "cuda/hopper/backward/epilogue.cuh"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/wgmma.cuh"
#include "cuda/hopper/ptx/wgmma_ops.cuh"

namespace gqattn::hopper::bwd {

// This path has no fused dQ, whose barriers use the same IDs.
constexpr uint32_t kGradSentBarrier = ptx::kFirstNamedBarrier;  // buffer b: + b
constexpr uint32_t kGradFreeBarrier = kGradSentBarrier + 2;     // buffer b: + b
static_assert(kGradFreeBarrier + 1 < kGradientStoreBarrier, "named barrier IDs overlap");

constexpr uint32_t kXchgGroupBytes = 16;  // one st/ld.shared.v4 per thread

__device__ __forceinline__ uint32_t xchg_group_addr(uint32_t buffer, int j) {
  return buffer + (uint32_t(j) * kWarpgroupThreads + uint32_t(threadIdx.x) % kWarpgroupThreads) *
                      kXchgGroupBytes;
}

// One 16-byte group of four floats to / from shared address `addr`.
__device__ __forceinline__ void store_group_f32(uint32_t addr, const float (&v)[4]) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v[0]), "f"(v[1]),
               "f"(v[2]), "f"(v[3])
               : "memory");
}
__device__ __forceinline__ void load_group_f32(uint32_t addr, float (&v)[4]) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "r"(addr)
               : "memory");
}

// Run by all 128 threads of consumer warpgroup `wg` (0: dV, 1: dK).
// kPoly: as dkdv_kernel.cuh's dkdv_consume.
template <int kD, typename Elem, bool kSoftcap, bool kPoly>
__device__ __forceinline__ void dkdv_consume_split_grad(const BackwardParams& p, const DkdvWork& w,
                                                        const fused::MaskPolicy& mask,
                                                        uint32_t smem,
                                                        const unsigned char* smem_ptr, int wg) {
  using Tile = DkdvTile<kD>;
  using L = DkdvSmem<kD, false>;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kNT = kBM / fused::kMmaN;  // n8 blocks of S^T, dP^T (queries)
  constexpr int kStepsD = kD / kWgmmaK;    // k-steps of S^T, dP^T
  constexpr int kStepsM = kBM / kWgmmaK;   // k-steps of dV, dK
  constexpr uint32_t kThreads = kBwdConsumerWarpgroups * kWarpgroupThreads;
  static_assert(Tile::kSplitGradients && kBN == kWgmmaM, "one wgmma M of keys, shared");
  static_assert(Tile::kColsPerWg == kD, "each warpgroup owns all d columns of its gradient");
  static_assert(uint32_t(kWarpgroupThreads) * kNT * kXchgGroupBytes <= L::kXchgBytes,
                "a hand-over fits its buffer");

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int warp_key0 = w.n0 + warp * fused::kMmaM;

  float acc[kD / 8][4];  // dV (warpgroup 0) or dK (warpgroup 1)
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

  if (w.steps > 0) ptx::mbar_wait(smem + L::kKVFull, 0);

  for (int t = 0; t < w.steps; ++t) {
    const int stage = t % Tile::kStages;
    const uint32_t parity = uint32_t(t / Tile::kStages) & 1u;
    const int m0 = w.m0(t, kBM);
    const uint32_t q_tile = smem + L::kQ + uint32_t(stage) * L::kQBytes;
    const uint32_t do_tile = smem + L::kDo + uint32_t(stage) * L::kQBytes;
    const uint32_t buffer = smem + L::kXchg + uint32_t(t & 1) * L::kXchgBytes;
    const float* lse2 = reinterpret_cast<const float*>(smem_ptr + L::kLse2 + stage * L::kRowBytes);
    const float* dsum = reinterpret_cast<const float*>(smem_ptr + L::kDsum + stage * L::kRowBytes);

    // x: S^T then P^T (warpgroup 0), or dP^T then dS^T (warpgroup 1).
    float x[1][kNT][4];
    uint32_t a[kStepsM][4];  // P^T or dS^T as register A operand
    ptx::mbar_wait(smem + L::kFull + uint32_t(stage) * L::kBarrierBytes, parity);
    // S^T = K Q^T or dP^T = V dO^T (one loop for both warpgroups: ptxas
    // closes a wgmma group issued on divergent paths with an extra wgmma).
    const uint32_t a_keys = smem + (wg == 0 ? L::kK : L::kV);
    const uint32_t b_queries = wg == 0 ? q_tile : do_tile;
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      ptx::Wgmma<kBM, Elem>::ss(x[0], k_major<kBN>(a_keys, kk), k_major<kBM>(b_queries, kk),
                                kk > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(x[0]);

    if (wg == 0) {
      // P^T (and the softcap factor), then the hand-over.
      [[maybe_unused]] float factor[kNT][4];
      if constexpr (kSoftcap) {
        to_softcap_r_tile<kPoly>(x, p.c.score,
                                 [&factor](int nt, int e, float f) { factor[nt][e] = f; });
        p_from_scores</*kRowsAreKeys=*/true>(x, lse2, -2.0f * p.c.score.mult, mask, w.n0, warp_key0,
                                             m0, lane);
      } else {
        p_from_scores</*kRowsAreKeys=*/true>(x, lse2, p.c.score.mult, mask, w.n0, warp_key0, m0,
                                             lane);
      }
      if (t >= 2) ptx::named_barrier_sync(kGradFreeBarrier + uint32_t(t & 1), kThreads);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        float h[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) h[e] = kSoftcap ? x[0][nt][e] * factor[nt][e] : x[0][nt][e];
        store_group_f32(xchg_group_addr(buffer, nt), h);
      }
      ptx::named_barrier_arrive(kGradSentBarrier + uint32_t(t & 1), kThreads);
#pragma unroll
      for (int kk = 0; kk < kStepsM; ++kk)
        fused::acc_to_a<Elem>(a[kk], x[0][2 * kk], x[0][2 * kk + 1]);
    } else {
      // dS^T = hand-over o (dP^T - D).
      dp_minus_d</*kRowsAreKeys=*/true>(x, dsum, lane);
      ptx::named_barrier_sync(kGradSentBarrier + uint32_t(t & 1), kThreads);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        float h[4];
        load_group_f32(xchg_group_addr(buffer, nt), h);
#pragma unroll
        for (int e = 0; e < 4; ++e) x[0][nt][e] *= h[e];
      }
      if (t + 2 < w.steps) ptx::named_barrier_arrive(kGradFreeBarrier + uint32_t(t & 1), kThreads);
#pragma unroll
      for (int kk = 0; kk < kStepsM; ++kk)
        fused::acc_to_a<Elem>(a[kk], x[0][2 * kk], x[0][2 * kk + 1]);
    }

    // dV += P^T dO or dK += dS^T Q (B MN-major: N = all 256 columns, four
    // column blocks of kBM rows).
    const uint32_t b_tile = wg == 0 ? do_tile : q_tile;
    ptx::pin(acc);
    ptx::pin(a);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepsM; ++kk)
      ptx::Wgmma<kD, Elem>::rs(acc, a[kk], mn_major<kBM>(b_tile, kk), 1);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::pin(acc);
    // Every wgmma of this warpgroup reading the slot has completed.
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(smem + L::kEmpty + uint32_t(stage) * L::kBarrierBytes);
  }

  // Staged and stored by TMA where the gradients allow it:
  // docs/decisions/hopper-backward-gradients-by-tma.md.
  if (p.grads_by_tma) {
    // Warpgroup 0 holds dV, warpgroup 1 dK, of the same 64 keys.
    const uint32_t staging = smem + L::kGradStaging + uint32_t(wg) * L::kGradTileBytes;
    staging_acquire();
    stage_rows<kD, Elem, /*kByStmatrix=*/true>(staging, acc, wg == 0 ? 1.0f : p.dkdq_scale);
    staging_publish();
    if (staged_store_issuer()) {
      store_staged_tile<kD>(wg == 0 ? &p.dv_map : &p.dk_map, staging, w.n0, 0, w.hk, w.tb);
      finish_gradient_stores();
    }
    return;
  }
  // Keys up to k_rows: a varlen sequence's rows past seqused_k get zeros.
  const fused::BackwardParams& c = p.c;
  if (wg == 0) {
    Elem* dv_out = static_cast<Elem*>(c.dv) + w.tb * c.dv_stride.batch + w.hk * c.dv_stride.head +
                   int64_t(w.k_row0) * c.dv_stride.row;
    store_rows<kD, Elem>(dv_out, c.dv_stride.row, warp_key0, w.k_rows, c.head_dim, acc, 1.0f);
  } else {
    Elem* dk_out = static_cast<Elem*>(c.dk) + w.tb * c.dk_stride.batch + w.hk * c.dk_stride.head +
                   int64_t(w.k_row0) * c.dk_stride.row;
    store_rows<kD, Elem>(dk_out, c.dk_stride.row, warp_key0, w.k_rows, c.head_dim, acc,
                         p.dkdq_scale);
  }
}

}  // namespace gqattn::hopper::bwd
