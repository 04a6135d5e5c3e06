// cuda-hopper: the backward's tile shapes per head dimension and its
// performance switches (plain C++, included by backward_params.hpp). Every
// switch only reorders or re-buffers work that is already correct with it
// off; flip one to false to go back to the simpler schedule (docs/hopper.md,
// "Backward"). Checked by compiling (`-Xptxas -v`: no spills, no
// serialised wgmma) and by tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gqattn::hopper::bwd {

// sm_90's opt-in shared memory per block (227 KB); every layout must fit.
constexpr std::size_t kBwdMaxSmemBytes = 227 * 1024;

// Overlap in both kernels: S (S^T) and dP (dP^T) are committed as two wgmma
// groups; P is computed from S while the dP group still runs (wait_group 1,
// then 0). Off: one group, wait_group 0.
constexpr bool kBwdOverlapSdP = true;
// The same overlap under softcap, for d <= kBwdOverlapSdPSoftcapMaxD: while
// dP still runs, r = 1 / (e^(2 S pre) + 1), the factor r - r^2 of
// 1 - tanh^2 (a third accumulator-sized array) and P are formed from S; once
// dP has landed only dP - D times the factor is left. The products are those
// of the serial order, so are the bits. Measured on the H200 (fused dQ, bwd
// TFLOP/s, overlapped / serial, two builds each, one call): d64 causal cap30
// B4 T4k 311, 313 / 304, 306; d128 causal 431, 456 / 439, 442 and
// non-causal 461, 462 / 475, 475 (the d128 kernels use R237 of 240 either
// way, so the third array leaves ptxas no slack); again on 2026-12-03 (200
// calls back to back): d128 causal cap30 429 / 437, 437. Above the bound: one
// group, all element-wise work after it. d 256 splits S and dP between the
// warpgroups (split_handover) and does not use either.
constexpr int kBwdOverlapSdPSoftcapMaxD = 64;
constexpr bool overlap_s_dp(bool softcap, int d) {
  return kBwdOverlapSdP && (!softcap || d <= kBwdOverlapSdPSoftcapMaxD);
}

// Under softcap, r = 1 / (e^(2 S pre) + 1) = (1 - tanh(S pre)) / 2 by the
// forward's polynomial tanh (flash/softcap_poly.hpp, no MUFU op) on every
// step where all of a warp's raw scores have |S pre| <= 0.625 (one vote),
// else by ex2 + rcp (fused::softcap_r), for d <= kBwdSoftcapPolyMaxD. Off:
// always the latter. H200, one call, two builds each (bwd TFLOP/s, on for
// every d / off): d64 causal cap30 B4 T4k 329, 330 / 315, 315; d128 causal
// 436, 437 / 440, 440, B1 T16k 480, 477 / 481, 485, non-causal 469, 468 /
// 475, 475; d256 causal w4096 cap50 B2 T8k 372, 370 / 379, 378. d64's
// kernel has half the tensor work per score and gains; d128 and d256 are
// not bound by the MUFU pipe and lose the vote and the longer chain.
constexpr bool kBwdSoftcapPoly = true;
constexpr int kBwdSoftcapPolyMaxD = 64;
constexpr bool bwd_softcap_poly(int d) { return kBwdSoftcapPoly && d <= kBwdSoftcapPolyMaxD; }

// Overlap in the dK/dV kernel: dV += P^T dO is committed on its own and runs
// while dS^T is computed; then dK += dS^T Q. Off: both in one group after dS.
constexpr bool kBwdOverlapDv = true;
// The gradients' epilogue (backward_epilogue.cuh): each consumer
// warpgroup writes its rounded dK and dV (dK/dV kernel) or dQ (dQ kernel)
// rows into shared memory the ring no longer needs, swizzled as the
// gradient's TMA map expects, and one thread per warpgroup stores them by
// TMA, where dq, dk and dv all meet TMA's alignment
// (BackwardParams::grads_by_tma, decided on the host). Otherwise, and off:
// plain 32-bit stores from registers (store_rows). The cost it attacks,
// measured on the H200 by skipping the stores (wrong results; bwd TFLOP/s,
// base / no dQ, dK, dV stores): causal B16 T1k 334 / 364, window 1024 350 /
// 376, causal T4k 500 / 505. Measured (bwd TFLOP/s, one call, on / off,
// two builds each): causal B16 T1k 346, 349 / 330, 329; window 1024 371,
// 387 / 377, 357; T4k 511, 528 / 514, 507; B1 T16k 555, 554 / 557, 552;
// d256 causal T4k 413, 420 / 390, 396; cap30 452, 449 / 449, 447; but d64
// causal T4k 391, 395 / 407, 403, so d64 kept its plain stores until the
// staging went by stmatrix (kBwdStmatrixStaging); since then d64 gains too
// (bwd TFLOP/s, 100 calls, two builds each, on / off: causal B4 T4k 415,
// 410 / 408, 408; B16 T1k 256, 255 / 253, 254; cap30 342, 344 / 336, 341;
// docs/hopper.md Backward TODO 9), so every d takes it.
constexpr bool kBwdTmaStoreGradients = true;
// The staged dK, dV and dQ (kBwdTmaStoreGradients) written into shared
// memory by stmatrix.x4 (staged_store.cuh stage_rows; the forward's switch
// is tile_sizes.hpp kStmatrixStaging). H200 (bwd TFLOP/s, mean of three
// runs on / six off, 100 calls each): d128 causal B16 T1k 350 / 337, T4k
// 502 / 503, d256 causal T4k 410 / 408 (docs/hopper.md forward TODO 11).
constexpr bool kBwdStmatrixStaging = true;
// The fused dQ's dS^T stores (backward_dq_fused.cuh store_ds_rows) by
// stmatrix.x4: 4 instructions per thread and step instead of 16 32-bit
// stores, in the phase where both consumer warpgroups meet (the dS^T
// stores, their fence and the named barrier were 9% of the d128 consumer
// loop's samples, docs/hopper.md Backward TODO 4). Off: 32-bit stores.
// H200, with the lse2 / D pairs of the same change (bwd TFLOP/s, on / off,
// two builds each alternated, 60 calls): d128 causal T4k 503.5, 502.3 /
// 502.2, 502.0; T16k 555.2, 564.3 / 558.0, 554.7; cap30 444.4, 441.8 /
// 441.8, 442.8; non-causal 550.8, 549.8 / 548.6, 546.0; d64 causal T4k
// 443.5, 436.0 / 427.8, 437.1. Kept for the key loop's 8% fewer
// instructions; the gain (+0.2 to +1.7% in the means) is within a run's
// spread on most shapes.
constexpr bool kBwdStmatrixDs = true;
// Ring depth of Q/dO (dK/dV kernel) and K/V (dQ kernel) for d <= 128:
// 3 slots (shared memory allows it at one CTA per SM) instead of 2.
constexpr bool kBwdDeepRing = true;
constexpr int kBwdRingStagesDeep = 3;
constexpr int kBwdRingStagesShallow = 2;

// Fused dQ (d <= 128, chosen per call: hopper_backend.cpp
// use_fused_dq): the dK/dV kernel also forms each step's dQ partial
// dS K (the fifth GEMM; dS through shared memory) and reduce-adds it into an
// f32 accumulator by bulk copy, instead of the separate dQ kernel that
// recomputes S and dP (seven GEMMs in all). Deterministic: the adds into
// one query tile are ordered by a semaphore, lowest key tile first
// (backward_dkdv_kernel.cuh). d = 256 keeps
// the separate kernel: its dK or dV of 256 columns leaves room for a 64-column
// slice of the partial only, and a fused form built that way (commit ca2b9b0)
// measured slower, bound by its reduce-adds (64 KB per 64-key step, twice
// d128's bytes per FLOP; docs/hopper.md, Backward TODO 5). Off: the separate
// dQ kernel for every d (and the fused kernels are not compiled).
constexpr bool kBwdFusedDq = true;
// Fused dQ: threads of the producer warpgroup that move the staged partials
// to the accumulator, writer i taking the steps t = i mod kDqWriters. An
// ordered add must complete before the next key tile may add to the same
// query tile, and that takes longer than a step's matrix products; with two
// writers one waits for its add while the other issues the next. 1: one
// writer does every step.
constexpr int kDqWriters = 2;
// Fused dQ: the conversion kernel (backward_dq_convert.cuh) runs in the
// dK/dV kernel's tail (programmatic dependent launch): the dK/dV CTAs let it
// be scheduled as soon as all of them have started, and its CTAs, a
// persistent grid of kDqConvertCtasPerSm per SM, poll their share of the
// accumulator's blocks and convert each once its semaphore shows that every
// key tile visiting it has added, in whatever order that happens; they wait
// for the dK/dV grid to complete before they exit, so that later work on the
// stream sees dk and dv as before. Why: the pass over the accumulator took
// 0.11 of the 2.9 ms of the fused d128 causal B4 T4k backward (Nsight
// Compute, docs/hopper.md Backward TODO 4), time in which the dK/dV kernel's
// last wave leaves SMs idle. Measured on / off (docs/hopper.md Backward
// TODO 2): a small gain, +0.2 to +1.5% in the mean of four runs of 60 to 200
// calls, none alone beyond the noise; +5% on the fused path at B16 T1k. A
// fixed conversion order (latest query tile first) was neutral: those blocks
// complete last. 2, 4 or 8 CTAs per SM measure the same. Off: one CTA per
// block, launched after the dK/dV kernel has completed (the same kernel; its
// semaphore checks then pass at once).
constexpr bool kBwdDqConvertOverlap = true;
constexpr int kDqConvertCtasPerSm = 4;
// Fused dQ by turns: step t's partial (its 64 queries, all d columns, over
// the CTA's kBlockN keys) is formed by consumer warpgroup t % 2 alone, once
// its own dV and dK wgmmas have completed (so that P^T and dS^T are dead
// and the accumulator of d columns fits beside dK and dV; at d = 128, 64
// registers); the other warpgroup hands over its half
// of dS^T and goes on to the next step without waiting. The two
// warpgroups then run out of phase, one's element-wise work under the
// other's matrix products. Off: both meet at a barrier every step and each
// forms half of the columns, so their element-wise phases coincide and
// the tensor pipe idles through them (docs/hopper.md, Backward TODO 4).
// For d <= kBwdDqByTurnsMaxD. Measured on the H200 (bwd TFLOP/s, one call,
// by turns / lockstep / by turns / lockstep): d64 causal B4 T4k 445, 415,
// 445, 415; B1 T16k 462, 439, 468, 442; non-causal 454, 439, 458, 439;
// causal cap30 353, 329, 349, 328. At d128 it gains nothing: with one
// staging buffer (the d128 kernel has no room for a second beside its
// 3-slot ring) causal B4 T4k 531, 540, 565, 539, B1 T16k 565, 564, 564,
// 556, non-causal 548, 548, 548, 587, cap30 452, 451, 451, 455; with a
// buffer per warpgroup and a 2-slot ring, against the 2-slot ring alone
// (another call): T4k 534, 555 / 551, T16k 563, 566 / 562, non-causal 548,
// 552 / 548, cap30 475, 472 / 477. So d128 keeps the lockstep. (By turns
// at d128 needs kBwdDeepRing false: its second staging buffer does not fit
// beside 3 slots, and DkdvSmem's static_assert says so.)
constexpr bool kBwdDqByTurns = true;
constexpr int kBwdDqByTurnsMaxD = 64;
constexpr bool dq_by_turns(int d) { return kBwdDqByTurns && d <= kBwdDqByTurnsMaxD; }

// d = 256: one consumer warpgroup cannot hold dK and dV of 64 rows (2 x 128
// f32 registers per thread); split_d(d) says the two share each tile, the
// dK/dV kernel as kBwdDkdvSplitD256 says (below). The split over d (the dK/dV
// kernel with kBwdDkdvSplitD256 = kD, the dQ kernel with
// kBwdDqWholeRowsD256 off): both consumer warpgroups own the SAME 64 rows,
// warpgroup w accumulating columns [128 w, 128 w + 128). Both need all of
// P and dS of those rows, which they trade (kBwdSplitExchange and
// kBwdSplitHandover, below); with a switch off, each warpgroup computes both
// S and dP (identical bits in both; 1/3 of the GEMM work redundant).
constexpr bool split_d(int d) { return d > 128; }
// Split over d, without softcap: instead of both computing S^T and dP^T,
// warpgroup 0 computes S^T (and P^T), warpgroup 1 dP^T (and dP^T - D), and
// they trade the two f32 tiles through shared memory (2 x 16 KB,
// backward_split_exchange.cuh); a third of the GEMM work is no longer done
// twice. Off: both warpgroups compute both, as described above.
constexpr bool kBwdSplitExchange = true;
constexpr bool split_exchange(int d, bool softcap) {
  return split_d(d) && kBwdSplitExchange && !softcap;
}
// Split over d, under softcap (dS also needs 1 - tanh(S)^2, which only the
// warpgroup that computed S has): warpgroup 1 computes dP^T - D and hands
// it to warpgroup 0, which computes S^T, the softcap, P^T and dS^T and hands
// back their packed 16-bit A fragments (the same 2 x 16 KB of shared
// memory; backward_split_exchange.cuh). Besides the redundant GEMM, the
// tanh and exponentials are no longer done twice. Off: both warpgroups
// compute both.
constexpr bool kBwdSplitHandover = true;
constexpr bool split_handover(int d, bool softcap) {
  return split_d(d) && kBwdSplitHandover && softcap;
}

// How the two consumer warpgroups of the dK/dV kernel share a key tile at d
// = 256 (dK and dV of 64 keys x 256 columns are 256 f32 registers per
// thread, twice what one warpgroup can hold):
// - kGradients (backward_dkdv_split_grad.cuh): warpgroup 0 owns dV (all
//   256 columns), warpgroup 1 dK; 0 computes S^T and P^T, 1 dP^T, and 0
//   hands its f32 P^T (under softcap times the factor of 1 - tanh^2) to 1,
//   which needs it for dS^T. The hand-over goes one way, so warpgroup 0
//   runs up to a step ahead and the two fill the tensor pipe during each
//   other's element-wise work; dV and dK are RS wgmma with N = 256, the
//   fewest shared-memory bytes per product of the layouts tried;
// - kD: both own the same 64 keys and split d (columns [128 w, 128 w +
//   128) of dK and dV); they trade S^T and dP^T every step
//   (backward_split_exchange.cuh), in lockstep.
// Measured on the H200 (bwd TFLOP/s, one call, gradients / d / gradients
// again): d256 causal B4 T4k H16/8 428.8 / 385.8 / 401.7; non-causal
// 412.7 / 397.1 / 411.9; causal window 4096 softcap 50 B2 T8k 375.7 /
// 368.2 / 376.3; causal B16 T1k 276.5 / 281.5 / 284.6. Nsight Compute, d256
// causal: the dK/dV kernel takes 1.69 ms split by gradient, 1.88 ms with
// FlashAttention-3's layout (S and dP split along the keys, P and dS through
// shared memory, dK^T and dV^T from SS wgmma: commit 3a66198, removed
// after it measured slowest, 377 / 393 / 356 / 262 in the same call; its
// m64n32 and SS m64n64 wgmmas read more shared memory per product, 83% of
// the shared-memory pipe's peak against 65% split by gradient).
// (kNone: d <= 128, where each consumer warpgroup owns 64 keys of its own.)
enum class DkdvSplit { kNone, kD, kGradients };
constexpr DkdvSplit kBwdDkdvSplitD256 = DkdvSplit::kGradients;
constexpr DkdvSplit dkdv_split(int d) { return split_d(d) ? kBwdDkdvSplitD256 : DkdvSplit::kNone; }

// kBwdDkdvGroupMaxPairs: the dK/dV grid in tile_order.hpp's kv-grouped
// order, the key tiles of a group of (batch, kv head) pairs in turn: the
// CTAs running at one time then share the Q / dO of few pairs in L2, where
// the key-tile-major order has a wave read those of every pair (Nsight
// Compute, fused d128 dK/dV: L2 hit rate 73% non-causal, 81% causal T16k;
// docs/hopper.md Backward TODO 8). A group is the fewest pairs, at most
// kBwdDkdvGroupMaxPairs, that divide the pairs into two groups or more and
// hold at least 1.5 waves of CTAs (one per SM): under a causal mask a
// group's first key tiles run longest, and a group shorter than they are
// leaves them as a tail (a list-scheduling simulation: 5-15% longer at B4
// T4k with groups under 1.5 waves). Measured on the H200 (bwd TFLOP/s,
// grouped / key-tile major, three calls):
// - d128 causal B4 T4k H32/8, 8 pairs: 549, 522, 531, 529, 505, 498 / 478,
//   504, 480, 485, 495, 508; 2 or 4 pairs (below 1.5 waves) 478-497, 16:
//   495;
// - non-causal, 8 pairs: 543, 543, 548, 553 / 519, 519, 534, 534, 518, 520;
// - B1 T16k, 2 pairs: 555, 554 / 541, 542 (4 pairs 549, 551; 1 pair, below
//   1.5 waves, 534 against 549, 545 in a later call, 200 calls back to back);
// - B16 T1k (8 key tiles: 32 pairs for 1.5 waves, above the cap): 8 pairs
//   324, 329, 327, 327; 32 pairs 332 / 325-337 key-tile major;
// - d256 causal B4 T4k within the spread for 2 to 16 pairs (docs/hopper.md
//   Backward TODO 8).
// Grouping the separate dQ kernel's grid the same way (8 or 16 pairs)
// measured within the spread, so it stays longest first. 0: key-tile
// major everywhere.
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

constexpr bool fused_dq_supported(int d) { return kBwdFusedDq && !split_d(d); }

// dK/dV: kBlockN keys per CTA (64 per consumer warpgroup, or 64 shared by
// both at d = 256), query tiles of kBlockM rows (the N of S^T = K Q^T and
// the K of dV += P^T dO), kStages slots of Q, dO, lse2, D. Per consumer
// thread: S^T, dP^T 2 x kBlockM/2, dK, dV 2 x kColsPerWg/2 f32 registers
// (64 + 128 for d 128; at d 256 split by gradient one of S^T, dP^T and one
// of dK, dV of 256 columns: 32 + 128).
template <int kD>
struct DkdvTile {
  static constexpr DkdvSplit kSplit = dkdv_split(kD);
  static constexpr bool kSplitD = kSplit == DkdvSplit::kD;
  static constexpr bool kSplitGradients = kSplit == DkdvSplit::kGradients;
  static constexpr int kBlockN = split_d(kD) ? 64 : 128;
  static constexpr int kBlockM = 64;
  static constexpr int kStages =
      (!split_d(kD) && kBwdDeepRing) ? kBwdRingStagesDeep : kBwdRingStagesShallow;
  static constexpr int kColsPerWg = kSplitD ? kD / 2 : kD;  // dK, dV columns of one warpgroup
  // Fused dQ: warpgroup w computes columns [w kDqCols, (w + 1) kDqCols) of
  // the step's 64 x d partial, over all kBlockN keys of the CTA; by turns
  // (dq_by_turns) one warpgroup computes all d columns.
  static constexpr bool kFusedDqSupported = fused_dq_supported(kD);
  static constexpr bool kDqByTurns = dq_by_turns(kD);
  static constexpr int kDqCols = kDqByTurns ? kD : kD / 2;
};
// dQ kernel at d = 256 with whole rows: each consumer warpgroup owns 64
// query rows and all 256 dQ columns (128 f32 registers per thread), over key
// tiles of 32 (so that the 128-row Q and dO, 128 KB, and three K/V slots of
// 32 KB fit), like d <= 128: no split over d, hence no exchange between the
// warpgroups, which then no longer wait for each other every step, and each
// K/V tile serves 128 query rows instead of 64. Off: split over d as the
// dK/dV kernel (64 rows, 64-key tiles, two slots). Measured on the H200
// (bwd TFLOP/s, whole rows / split, two builds each, one call; the dK/dV
// kernel is the same in both): d256 causal B4 T4k H16/8 390, 383 / 357,
// 350; non-causal 400, 402 / 366, 366; causal window 4096 softcap 50 B2
// T8k 369, 372 / 345, 346; causal B16 T1k 284, 274 / 261, 262.
constexpr bool kBwdDqWholeRowsD256 = true;
constexpr bool dq_split_d(int d) { return split_d(d) && !kBwdDqWholeRowsD256; }

// dQ: kBlockM query rows per CTA (64 per consumer warpgroup, or 64 shared by
// both when split over d), key tiles of kBlockN in a kStages ring (K and V
// of a tile share one slot).
template <int kD>
struct DqTile {
  static constexpr bool kSplitD = dq_split_d(kD);
  static constexpr bool kShortKeys = !kSplitD && kD > 128;  // whole rows at d = 256
  static constexpr int kBlockM = kSplitD ? 64 : 128;
  static constexpr int kBlockN = kShortKeys ? 32 : 64;
  // Whole rows at d = 256 take the deep ring whatever kBwdDeepRing says
  // (three 32-key slots fit; the only depth measured).
  static constexpr int kStages =
      (kShortKeys || (!kSplitD && kBwdDeepRing)) ? kBwdRingStagesDeep : kBwdRingStagesShallow;
  static constexpr int kColsPerWg = kSplitD ? kD / 2 : kD;  // dQ columns of one warpgroup
};

}  // namespace gqattn::hopper::bwd
