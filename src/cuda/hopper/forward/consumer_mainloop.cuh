// cuda-hopper: a consumer warpgroup's main loop: for each key tile the
// producer delivers, S = Q K^T on wgmma (both operands from shared memory,
// or, where q_in_registers(), Q from registers loaded once per work tile),
// softcap and mask (cuda-flash's policy), online softmax (softmax.cuh, the
// arithmetic of cuda-flash's; under ScoreMode::softcap_without_row_max the
// no-offset softmax, with no row maximum and no rescale of O, and o divided
// by the row sums of the 16-bit P, P times ones on wgmma), then O += P V on
// wgmma with P from registers.
// Checked against the f64 oracle by tests/gpu/test_hopper_forward.cpp.
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
// Schedule: key tiles are visited in order it = 0, 1, ... (n_block =
// keys.last - it), slot it % kStages. Overlapped within the warpgroup
// (FlashAttention-3's intra-warpgroup pipelining): prologue S(0),
// softmax(0); step it >= 1: finish step it-1 (wait_group 0: release
// V(it-2), rescale O, P(it-1) to A fragments); [wait V(it-1), K(it)] issue
// S(it), then O += P(it-1) V(it-1); wait_group 1 (S(it) retired: release
// K(it)); softcap, mask, softmax of S(it) while the P V GEMM runs. After
// the loop: finish the last step, O += P(last) V(last). Ping-pong
// (PingPong below) orders the warpgroups' GEMM issues. Both:
// docs/decisions/hopper-forward-overlap-and-ping-pong.md.
// Invariants: an accumulator (S or O) is read only after the wait_group that
// retires its GEMM and a pin(); registers written by ordinary code (S reused
// as accumulator, O rescaled, P fragments) are fenced by wgmma_fence()
// before the next issue; the P fragments stay pinned (live) until the
// wait_group that retires the P V GEMM reading them; a K or V slot is
// released (one arrival per consumer warp) only after the GEMM that read it
// has retired (in every CTA of the cluster, with K/V multicast).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/fused/score_mode.hpp"
#include "cuda/fused/softcap.cuh"
#include "cuda/fused/softmax.cuh"
#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/forward/tile_schedule.cuh"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/operand_layout.hpp"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/ptx/cluster.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/wgmma.cuh"
#include "cuda/hopper/ptx/wgmma_ops.cuh"

namespace gqattn::hopper {

// One softmax row pair per thread (rows g and g + 8 of its warp's 16):
// kLazyLog2 is ForwardTile::kLazyRescaleLog2 (tile_sizes.hpp).
template <int kLazyLog2>
using RowSoftmax = fused::OnlineSoftmax<1, kLazyLog2>;
constexpr int kSoftmaxRows = RowSoftmax<0>::kRows;  // rows g and g + 8

constexpr uint32_t kKStepBytes = kWgmmaK * kElemBytes;       // 32: one k16 step along a row
constexpr uint32_t kStepsPerColBlock = kColBlock / kWgmmaK;  // 4
constexpr uint32_t kRowGroupBytes = kSwizzleAtomBytes;       // SBO: 8 rows x 128 B
constexpr uint32_t kUnusedLbo = 16;                          // K-major swizzled: ignored
constexpr uint32_t kVStepBytes = kWgmmaK * kSwizzleBytes;    // 16 key rows of V

// Descriptor of k-step kk of a K-major [rows x kD] tile at `tile` (kk a
// constant after unrolling: one descriptor per tile, the steps by adds).
template <int kRows>
__device__ __forceinline__ uint64_t k_major_desc(uint32_t tile, int kk) {
  const uint32_t offset = uint32_t(kk) / kStepsPerColBlock * (uint32_t(kRows) * kSwizzleBytes) +
                          uint32_t(kk) % kStepsPerColBlock * kKStepBytes;
  return ptx::desc_advance(ptx::make_desc_sw128(tile, kUnusedLbo, kRowGroupBytes), offset);
}

// Descriptor of k-step kk (keys 16 kk..16 kk + 15) of the MN-major V tile.
template <int kBN>
__device__ __forceinline__ uint64_t v_desc(uint32_t tile, int kk) {
  return ptx::desc_advance(
      ptx::make_desc_sw128(tile, uint32_t(kBN) * kSwizzleBytes, kRowGroupBytes),
      uint32_t(kk) * kVStepBytes);
}

// Q's register A fragments for S = Q K^T (q_in_registers(), tile_sizes.hpp):
// k-step kk of this warp's 16 rows of the warpgroup's Q tile at wg_q_tile
// (rows of a column block kBM apart), by ldmatrix.x4 at the addresses
// operand_layout.hpp derives from the swizzled layout (checked on the CPU by
// tests/cpu/test_hopper_operand_layout.cpp).
template <int kBM, int kSteps>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qa)[kSteps][4], uint32_t wg_q_tile,
                                                 int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    fused::ldsm_x4(qa[kk], wg_q_tile + a_fragment_ldmatrix_offset(kk, warp, lane, kBM));
}

// Whether o is divided by the row sums of the 16-bit P (P times a tile of
// ones on the tensor cores, below) rather than by the f32 sums: where no P
// is exactly 1 and many are large, i.e. without row maximum (score_mode.hpp).
// The kernel writes the ones tile exactly where this holds (kernel.cuh).
// Lazy rescaling above a threshold of 0 has the same need in a milder form
// and meets it more cheaply (fused/softmax.cuh OnlineSoftmax::kCompensate;
// these sums, tried for it, cost more tensor time than the skipped rescales
// saved: docs/decisions/hopper-forward-lazy-rescale.md).
constexpr bool uses_tensor_row_sums(ScoreMode scores) {
  return scores == ScoreMode::softcap_without_row_max;
}

// The result of a consumer warpgroup: its O rows (normalised) and their lse.
template <int kD>
struct ConsumerResult {
  float o[1][kD / 8][4];
  float lse[2];  // rows g and g + 8 of this warp's 16 rows
};

// Ping-pong (round robin) between the kN consumer warpgroups: each brackets
// every issue of its GEMMs ("issue point") with sync(own barrier) ...
// arrive(next's barrier), next = (wg + 1) % kN,
// every barrier counting 2 x 128 threads (its owner's syncs and its
// predecessor's arrivals), so the warpgroups issue in turn: WG0 point 0,
// WG1 point 0, ..., WG(kN-1) point 0, WG0 point 1, ...
// All warpgroups visit the same work tiles and key tiles, so all have the
// same number N of issue points in the CTA (per work tile with keys:
// tiles + 1). The points of all the CTA's work tiles form one stream: WG0
// skips only its first sync of the CTA (`issued` false).
// Balance, which keeps every barrier phase complete at exit: the last
// warpgroup arrives at every point (with the persistent grid it cannot know
// which is the CTA's last) and WG0 consumes the last arrival in drain()
// after its last tile; every barrier sees N and N.
// No barrier is ever arrived at twice before its sync: WG w's arrival k + 1
// on barrier next follows its own sync k + 1, which follows its
// predecessor's arrival k + 1, which (going round) follows next's sync k.
// Runs with kN = 2; the tall d64 tile's three warpgroups passed the forward
// tests with it but measured faster without (its kPingPongAllowed,
// docs/decisions/hopper-forward-tall-d64-tile.md).
template <int kN>
struct PingPong {
  static_assert(kN >= 2, "ping-pong needs two consumer warpgroups or more");
  static constexpr uint32_t kThreads = 2 * kWarpgroupThreads;
  bool on;
  int wg;
  bool issued = false;  // this warpgroup has passed an issue point in this CTA

  __device__ __forceinline__ uint32_t barrier(int w) const {
    return ptx::kFirstNamedBarrier + uint32_t(w);
  }
  __device__ __forceinline__ void begin() const {
    if (on && (wg != 0 || issued)) ptx::named_barrier_sync(barrier(wg), kThreads);
  }
  __device__ __forceinline__ void end() {
    if (on) ptx::named_barrier_arrive(barrier((wg + 1) % kN), kThreads);
    issued = true;
  }
  // After the CTA's last work tile.
  __device__ __forceinline__ void drain() const {
    if (on && wg == 0 && issued) ptx::named_barrier_sync(barrier(0), kThreads);
  }
};
static_assert(ptx::kFirstNamedBarrier + kMaxConsumerWarpgroups <= ptx::kNamedBarrierCount,
              "ping-pong barrier IDs out of range");

// Run by all 128 threads of consumer warpgroup `wg` (0, 1 or 2), which owns
// query rows [64 wg, 64 wg + 64) of the tile. `t`: the work tile's position
// in the CTA's schedule (Q arrives in phase t & 1 of q_full); `kv_base`: the
// K/V visits of the CTA's earlier work tiles (this tile's visit `it` is the
// producer's kv_base + it). Returns after every GEMM has retired and every
// K, V and Q slot of the tile has been released.
// kPolyAllowed: false in the varlen kernels. The polynomial tanh is chosen
// by one vote over the warp tile's logits, and a varlen tile's rows and
// columns past its sequence hold the neighbouring sequences' (masked
// later), so the vote, hence a sequence's bits, would depend on its batch.
template <class Tile, typename Elem, ScoreMode kScores, int kCluster, bool kPolyAllowed = true>
__device__ __forceinline__ void consume(const ForwardParams& p, const TileCoord& tile,
                                        const MaskPolicy& mask, uint32_t smem, int wg, int t,
                                        int kv_base, PingPong<consumer_warpgroups<Tile>()>& pp,
                                        ConsumerResult<Tile::kD>& out) {
  constexpr int kD = Tile::kD;
  using L = SmemLayout<Tile>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kStages = Tile::kStages;
  constexpr int kNT = kBN / 8;  // n8 blocks of S
  constexpr int kStepsQK = kD / kWgmmaK;
  constexpr int kStepsPV = kBN / kWgmmaK;
  static_assert(kBN % kWgmmaK == 0 && kNT == 2 * kStepsPV, "P V needs whole k16 steps of S");
  constexpr bool kSoftcap = fused::has_softcap(kScores);
  constexpr bool kRowMax = kScores != ScoreMode::softcap_without_row_max;
  constexpr bool kTensorRowSums = uses_tensor_row_sums(kScores);
  constexpr int kFmaExp2Quarters = forward_fma_exp2_quarters<Tile>(kSoftcap);
  constexpr bool kQInRegs = q_in_registers<Tile>(kSoftcap);

  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int wg_row0 = tile.m0 + wg * kWgmmaM;  // first query row of this warpgroup
  const int warp_row0 = wg_row0 + warp * fused::kMmaM;
  // The warpgroup's queries (packed GQA, pack_gqa.hpp: its rows' queries),
  // shifted here once rather than per key tile.
  const int wg_query0 = wg_row0 >> p.pack_shift;
  const int wg_query1 = (wg_row0 + kWgmmaM - 1) >> p.pack_shift;
  const uint32_t q_tile = smem + L::kQ + uint32_t(wg) * kWgmmaM * kSwizzleBytes;

  // Slot addresses and barrier parity of this tile's visit `it` (the CTA's
  // visit kv_base + it), exactly as the producer counts.
  const auto bar_off = [kv_base](int it) {
    return uint32_t((kv_base + it) % kStages) * L::kBarrierBytes;
  };
  const auto parity = [kv_base](int it) { return uint32_t((kv_base + it) / kStages) & 1u; };
  const auto k_tile = [smem, kv_base](int it) {
    return smem + L::kK + uint32_t((kv_base + it) % kStages) * L::kKVBytes;
  };
  const auto v_tile = [smem, kv_base](int it) {
    return smem + L::kV + uint32_t((kv_base + it) % kStages) * L::kKVBytes;
  };
  // One arrival per consumer warp releases a slot.
  const auto release = [lane](uint32_t bar) {
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(bar);
  };
  // A K or V slot: in a cluster (K/V multicast) every CTA's producer writes
  // into it, so the release goes to the slot's empty barrier in every CTA.
  const auto release_kv = [lane](uint32_t bar) {
    __syncwarp();
    if (lane == 0) {
      if constexpr (kCluster == 1) {
        ptx::mbar_arrive(bar);
      } else {
#pragma unroll
        for (uint32_t r = 0; r < uint32_t(kCluster); ++r)
          ptx::mbar_arrive_cluster(ptx::map_shared_rank(bar, r));
      }
    }
  };

  // Q as register A fragments (kQInRegs; loaded after q_full, below; they
  // stay live, pinned after every wait that retires an S GEMM, for the whole
  // work tile).
  uint32_t qa[kQInRegs ? kStepsQK : 1][4];
  const auto pin_q = [&qa] {
    if constexpr (kQInRegs) ptx::pin(qa);
  };
  // S = Q K^T (the first k-step overwrites S); committed as one group.
  const auto issue_qk = [q_tile, &qa](float(&s)[1][kNT][4], uint32_t k) {
#pragma unroll
    for (int kk = 0; kk < kStepsQK; ++kk) {
      if constexpr (kQInRegs)
        ptx::Wgmma<kBN, Elem>::rs_k(s[0], qa[kk], k_major_desc<kBN>(k, kk), kk > 0);
      else
        ptx::Wgmma<kBN, Elem>::ss(s[0], k_major_desc<kBM>(q_tile, kk), k_major_desc<kBN>(k, kk),
                                  kk > 0);
    }
    ptx::wgmma_commit();
  };
  // With kTensorRowSums, o is normalised by the row sums of the 16-bit P its
  // numerator used, not by the f32 sums of P (those give lse): no P is
  // exactly 1 in that mode, and a row dominated by one key must still get
  // o = v of that key exactly (score_mode.hpp). The tensor cores form them as
  // P times a [kBN x 8] tile of ones (every column of the m64n8 accumulator
  // is the row sum), in the same commit group as P V.
  float p_sums[1][1][4];
  const uint64_t ones_desc =
      ptx::make_desc_sw128(smem + L::kOnes, kSwizzleAtomBytes, kRowGroupBytes);
  // O += P V (and the row sums of P); committed as one group.
  const auto issue_pv = [&p_sums, ones_desc](float(&o)[1][kD / 8][4],
                                             const uint32_t(&pa)[kStepsPV][4], uint32_t v) {
#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk)
      ptx::Wgmma<kD, Elem>::rs(o[0], pa[kk], v_desc<kBN>(v, kk), 1);
    if constexpr (kTensorRowSums) {
#pragma unroll
      for (int kk = 0; kk < kStepsPV; ++kk)  // every k-step reads the same ones
        ptx::Wgmma<8, Elem>::rs(p_sums[0], pa[kk], ones_desc, 1);
    }
    ptx::wgmma_commit();
  };
  // Softcap (before masking), mask, softmax of visit `it`: S becomes P
  // (alpha: O's rescale factors, to be applied iff it returns true; false
  // without row max).
  // The tanh forms: the polynomial where the tile's logits are small
  // (docs/decisions/hopper-forward-softcap-poly.md), else one or two MUFU
  // ops per score (docs/decisions/hopper-forward-one-mufu-softcap.md).
  using Softmax = RowSoftmax<Tile::kLazyRescaleLog2>;
  const auto scores = [&](float(&s)[1][kNT][4], int it, Softmax& sm,
                          float(&alpha)[kSoftmaxRows]) -> bool {
    const int n0 = (tile.keys.last - it) * kBN;
    if constexpr (kSoftcap && !kRowMax) {  // S becomes v mult
      if (Tile::kSoftcapPolyAllowed && kPolyAllowed &&
          fused::softcap_poly_applies(s, p.score.poly_bound))
        fused::softcap_exponents_poly(s, p.score.pre, p.score.poly_exponent);
      else if constexpr (Tile::kTwoMufuSoftcapExponents)
        fused::softcap_exponents(s, p.score.pre, sm.mult);
      else
        fused::apply_softcap_1mufu</*kScaled=*/true>(s, p.score.pre, sm.mult);
    } else if constexpr (kSoftcap) {  // S becomes v
      if (Tile::kSoftcapPolyAllowed && kPolyAllowed &&
          fused::softcap_poly_applies(s, p.score.poly_bound))
        fused::softcap_tanh_poly(s, p.score.pre);
      else if constexpr (Tile::kFastSoftcapAllowed)
        fused::apply_softcap_1mufu(s, p.score.pre);
      else
        fused::apply_softcap(s, p.score.pre);
    }
    if (!mask.queries_fully_kept(wg_query0, wg_query1, n0, kBN))
      mask.apply</*kRowsAreKeys=*/false>(s, warp_row0, n0, lane, -INFINITY, p.pack_shift);
    if constexpr (kRowMax) {
      // Lazy rescaling at the tile's threshold:
      // docs/decisions/hopper-forward-lazy-rescale.md.
      return sm.template scores_to_p</*kLazy=*/true, kFmaExp2Quarters, Elem>(s, alpha);
    } else {
      sm.template update_unshifted<kFmaExp2Quarters>(s);
      return false;
    }
  };

  // P as the register A operand: k-step kk is S's n8 blocks 2kk, 2kk+1.
  const auto to_a = [](uint32_t(&pa)[kStepsPV][4], const float(&s)[1][kNT][4]) {
#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk)
      fused::acc_to_a<Elem>(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
  };

  auto& o = out.o;
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][i][e] = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) p_sums[0][0][e] = 0.0f;
  // O's accumulators (and the row sums of P, GEMM-written alike).
  const auto pin_o = [&] {
    ptx::pin(o[0]);
    if constexpr (kTensorRowSums) ptx::pin(p_sums[0]);
  };
  Softmax softmax(p.score.mult);
  if constexpr (!kRowMax) softmax.start_unshifted();
  float alpha[kSoftmaxRows];
  bool rescale = false;  // O needs alpha (warp-uniform)
  float s[1][kNT][4];
  uint32_t pa[kStepsPV][4];

  // Always wait for Q, even with no key tile: the CTA must not exit (nor
  // the producer overwrite Q) with its copy in flight, and q_full's phases
  // must advance once per work tile.
  ptx::mbar_wait(smem + L::kQFull, uint32_t(t) & 1u);
  if constexpr (kQInRegs) load_q_fragments<kBM>(qa, q_tile, warp, lane);
  const int tiles = tile.keys.last - tile.keys.first + 1;  // the same in both warpgroups
  // Once every S = Q K^T GEMM of the tile has retired (all read Q).
  const auto release_q = [&] { release(smem + L::kQEmpty); };

  // The end of step `it` (its softmax done): retire the P V GEMM of
  // visit it-1 (none when it == 0; wait_group 0 then returns at once) and
  // release its V slot, rescale O to step it's row maxima, P(it) to A
  // fragments.
  const auto finish_step = [&](int it) {
    ptx::wgmma_wait<0>();
    pin_o();
    ptx::pin(pa);  // the GEMM read pa until here
    if (it > 0) release_kv(smem + L::kVEmpty + bar_off(it - 1));
    if (kRowMax && rescale) softmax.rescale(o, alpha);
    to_a(pa, s);
  };
  if (tiles > 0) {
    // Prologue (issue point 0): S(0) alone.
    ptx::mbar_wait(smem + L::kKFull + bar_off(0), parity(0));
    pp.begin();
    ptx::wgmma_fence();
    issue_qk(s, k_tile(0));
    pp.end();
    ptx::wgmma_wait<0>();
    ptx::pin(s[0]);
    pin_q();
    release_kv(smem + L::kKEmpty + bar_off(0));
    rescale = scores(s, 0, softmax, alpha);  // alpha = 0 (row max was -inf); O is 0

    // Issue point it: S(it) and P(it-1) V(it-1) in flight together. The
    // loop is rotated: an iteration first finishes step it-1 (wait for its
    // P V GEMM, rescale O, convert P(it-1)), then issues and does the
    // softmax of S(it). The loop's back edge thus separates the softmax
    // from the wait_group 0 that follows it; within one basic block ptxas
    // hoists that wait above the softmax (seen with ptxas 13.0), which
    // serialises the softmax behind the P V GEMM and undoes the overlap.
    for (int it = 1; it < tiles; ++it) {
      finish_step(it - 1);
      // Both waits before the fence: a spin loop between the fence and a
      // wgmma makes ptxas inject another warpgroup.arrive (C7519). V(it-1)
      // was copied before K(it), so waiting for it first costs nothing.
      ptx::mbar_wait(smem + L::kVFull + bar_off(it - 1), parity(it - 1));
      ptx::mbar_wait(smem + L::kKFull + bar_off(it), parity(it));
      pp.begin();
      ptx::pin(s[0]);
      pin_o();
      ptx::pin(pa);
      ptx::wgmma_fence();
      issue_qk(s, k_tile(it));
      issue_pv(o, pa, v_tile(it - 1));
      pp.end();
      ptx::wgmma_wait<1>();  // S(it) retired; P V may still run
      ptx::pin(s[0]);
      pin_q();
      release_kv(smem + L::kKEmpty + bar_off(it));
      rescale = scores(s, it, softmax, alpha);  // overlaps the P V GEMM
    }
    release_q();  // S(tiles - 1) retired: by the loop's wait_group 1 or the prologue's 0
    finish_step(tiles - 1);

    // Epilogue (issue point tiles, the last): P(last) V(last).
    const int last = tiles - 1;
    ptx::mbar_wait(smem + L::kVFull + bar_off(last), parity(last));
    pp.begin();
    pin_o();
    ptx::pin(pa);
    ptx::wgmma_fence();
    issue_pv(o, pa, v_tile(last));
    pp.end();
    ptx::wgmma_wait<0>();
    pin_o();
    ptx::pin(pa);
    release_kv(smem + L::kVEmpty + bar_off(last));
  } else {
    release_q();
  }

  if constexpr (!kRowMax)
    softmax.finalize_unshifted(o, out.lse, p_sums[0]);
  else if constexpr (Softmax::kCompensate)
    softmax.finalize_compensated(o, out.lse);
  else
    softmax.finalize(o, out.lse);
}

}  // namespace gqattn::hopper
