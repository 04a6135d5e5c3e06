// cuda-hopper: the backward's tile shapes per head dimension and the
// measured choices they rest on (plain C++, included by params.hpp). Each
// choice has its record in docs/decisions/hopper-backward-*.md. Checked by
// compiling (`-Xptxas -v`: no spills, no serialised wgmma) and by
// tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gqattn::hopper::bwd {

// sm_90's opt-in shared memory per block (227 KB); every layout must fit.
constexpr std::size_t kBwdMaxSmemBytes = 227 * 1024;

// Both kernels commit S (S^T) and dP (dP^T) as two wgmma groups and form P
// from S while dP still runs (wait_group 1, then 0); under softcap only up
// to this d, where the third accumulator-sized array (the factor of
// 1 - tanh^2) pays: docs/decisions/hopper-backward-overlap-s-dp.md. d 256
// shares S and dP between the warpgroups (dkdv_split_grad.cuh) instead.
constexpr int kBwdOverlapSdPSoftcapMaxD = 64;
constexpr bool overlap_s_dp(bool softcap, int d) {
  return !softcap || d <= kBwdOverlapSdPSoftcapMaxD;
}

// Under softcap, r by the forward's polynomial tanh where a warp's raw
// scores all lie in its range, up to this d; above it the MUFU pipe is not
// the bound and ex2 + rcp is faster: docs/decisions/hopper-backward-softcap-poly.md.
constexpr int kBwdSoftcapPolyMaxD = 64;
constexpr bool bwd_softcap_poly(int d) { return d <= kBwdSoftcapPolyMaxD; }

// Ring depth of Q/dO (dK/dV kernel) and K/V (dQ kernel): 3 slots where
// shared memory allows it (d <= 128, and the d 256 dQ kernel's 32-key
// slots), else 2: docs/decisions/hopper-backward-deep-ring.md.
constexpr int kBwdRingStagesDeep = 3;
constexpr int kBwdRingStagesShallow = 2;

// Fused dQ: threads of the producer warpgroup that move the staged partials
// to the accumulator, writer i taking the steps t = i mod kDqWriters; with
// two, one waits for its ordered add while the other issues the next:
// docs/decisions/hopper-backward-fused-dq.md.
constexpr int kDqWriters = 2;
// Fused dQ: CTAs per SM of the conversion kernel's persistent grid, which
// runs in the dK/dV kernel's tail (2, 4 and 8 measure the same):
// docs/decisions/hopper-backward-dq-convert-overlap.md.
constexpr int kDqConvertCtasPerSm = 4;
// Fused dQ by turns up to this d: step t's whole partial formed by consumer
// warpgroup t % 2 alone, so that the two run out of phase; d 128 keeps the
// lockstep (no gain, and no room for a second staging buffer beside its
// 3-slot ring): docs/decisions/hopper-backward-dq-by-turns.md.
constexpr int kBwdDqByTurnsMaxD = 64;
constexpr bool dq_by_turns(int d) { return d <= kBwdDqByTurnsMaxD; }

// d = 256: one consumer warpgroup cannot hold dK and dV of 64 rows (2 x 128
// f32 registers per thread). The dK/dV kernel splits by gradient
// (dkdv_split_grad.cuh: warpgroup 0 owns dV, warpgroup 1 dK, of the same
// 64 keys): docs/decisions/hopper-backward-d256-dkdv-split-by-gradient.md.
// The dQ kernel keeps whole rows over 32-key tiles (DqTile below).
constexpr bool split_d(int d) { return d > 128; }

// The dK/dV grid in groups of (batch, kv head) pairs (tile_order.hpp
// key_tile_id), so that the CTAs running at one time share the Q / dO of
// few pairs in L2: a group is the fewest pairs, at most
// kBwdDkdvGroupMaxPairs, that divide the pairs into two groups or more and
// hold at least kBwdDkdvGroupMinHalfWaves / 2 waves of CTAs (shorter
// groups leave the causal mask's long first key tiles as a tail):
// docs/decisions/hopper-backward-dkdv-grid-groups.md. The separate dQ
// kernel's grid stays longest first (grouping it measured within the
// spread).
constexpr int kBwdDkdvGroupMaxPairs = 8;
constexpr int kBwdDkdvGroupMinHalfWaves = 3;
// The pairs per group of the dK/dV grid (0: key-tile major) for num_pairs
// pairs of key_tiles key tiles each on a GPU of `sms` multiprocessors.
constexpr int dkdv_group_pairs(int num_pairs, int key_tiles, int sms,
                               int max_pairs = kBwdDkdvGroupMaxPairs) {
  for (int pairs = 1; pairs <= max_pairs && pairs < num_pairs; ++pairs)
    if (num_pairs % pairs == 0 &&
        2 * int64_t(pairs) * key_tiles >= int64_t(kBwdDkdvGroupMinHalfWaves) * sms)
      return pairs;
  return 0;
}

// Fused dQ for d <= 128: the dK/dV kernel also forms dS K and reduce-adds
// it into an f32 accumulator in a fixed order; d 256 keeps the separate dQ
// kernel (its 64 KB of adds per 64-key step do not keep up):
// docs/decisions/hopper-backward-fused-dq.md. Which call takes it:
// plan.cpp, docs/decisions/hopper-backward-dq-path.md.
constexpr bool fused_dq_supported(int d) { return !split_d(d); }

// dK/dV: kBlockN keys per CTA (64 per consumer warpgroup, or 64 shared by
// both at d = 256), query tiles of kBlockM rows (the N of S^T = K Q^T and
// the K of dV += P^T dO), kStages slots of Q, dO, lse2, D. Per consumer
// thread: S^T, dP^T 2 x kBlockM/2, dK, dV 2 x kD/2 f32 registers (64 + 128
// for d 128; at d 256 split by gradient one of S^T, dP^T and one of dK, dV
// of 256 columns: 32 + 128).
template <int kD>
struct DkdvTile {
  static constexpr bool kSplitGradients = split_d(kD);
  static constexpr int kBlockN = split_d(kD) ? 64 : 128;
  static constexpr int kBlockM = 64;
  static constexpr int kStages = split_d(kD) ? kBwdRingStagesShallow : kBwdRingStagesDeep;
  static constexpr int kColsPerWg = kD;  // dK, dV columns of one warpgroup
  // Fused dQ: warpgroup w computes columns [w kDqCols, (w + 1) kDqCols) of
  // the step's 64 x d partial, over all kBlockN keys of the CTA; by turns
  // (dq_by_turns) one warpgroup computes all d columns.
  static constexpr bool kFusedDqSupported = fused_dq_supported(kD);
  static constexpr bool kDqByTurns = dq_by_turns(kD);
  static constexpr int kDqCols = kDqByTurns ? kD : kD / 2;
};

// dQ: kBlockM query rows per CTA (64 per consumer warpgroup, all d
// columns), key tiles of kBlockN in a kStages ring (K and V of a tile share
// one slot). At d = 256 the dQ accumulator is 128 f32 registers per thread
// and the key tiles are 32 keys, so that the 128-row Q and dO (128 KB) and
// three K/V slots (96 KB) fit: docs/decisions/hopper-backward-d256-dq-whole-rows.md.
template <int kD>
struct DqTile {
  static constexpr bool kShortKeys = kD > 128;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kShortKeys ? 32 : 64;
  static constexpr int kStages = kBwdRingStagesDeep;
  static constexpr int kColsPerWg = kD;  // dQ columns of one warpgroup
};

}  // namespace gqattn::hopper::bwd
