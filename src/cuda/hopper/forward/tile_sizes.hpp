// cuda-hopper: the forward's tile shapes per head dimension, its thread
// layout and register split, and the shared memory one CTA needs (the
// backend's why_not compares it with the device's opt-in limit). Plain C++
// so the host side can use it; the kernel static_asserts what it relies on.
// Checked by compiling and by tests/gpu/test_hopper_forward.cpp (d 64, 128,
// 256; the wide d128 tile by its non-causal d128 cases, the tall d64 tile by
// its d64 cases with Tk >= kTallD64MinKeys).
//
// A CTA owns kBlockM query rows of one head (128; 192 on the tall d64
// tile): one consumer warpgroup per 64 rows (the M of one wgmma) and one
// producer warpgroup whose first warp issues every TMA copy. Key tiles of
// kBlockN rows; K and V each go through a kStages-deep ring of
// shared-memory slots. Shared memory holds every tile as column blocks of
// 64 elements (128 bytes, the span of the 128-byte swizzle): a [rows x d]
// tile is d/64 blocks of [rows][64].
//
// The tile is a template parameter of the kernel (ForwardTile<kD, kShape>),
// chosen at launch by forward_shape(): per head dimension one default tile,
// plus at d128 a wide key tile, 128 x 176, for problems with neither causal
// mask nor window, and at d64 a tall tile, 192 x 128 with three consumer
// warpgroups (FlashAttention-3's d64 tile), for long problems without
// softcap or window. A wide tile has fewer tiles, hence fewer softmax row
// reductions and barriers, per GEMM FLOP; a tall one more warps to hide the
// softmax's latencies and one K/V read for 1.5x the query rows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gqattn::hopper {

constexpr int kElemBytes = 2;                          // bf16 and f16
constexpr int kSwizzleBytes = 128;                     // the 128-byte swizzle's row span
constexpr int kSwizzleAtomBytes = 1024;                // 8 rows x 128 bytes: one swizzle pattern
constexpr int kColBlock = kSwizzleBytes / kElemBytes;  // 64 elements per block row
constexpr int kWarpSize = 32;
constexpr int kWarpgroupThreads = 128;
constexpr int kWarpsPerWarpgroup = kWarpgroupThreads / kWarpSize;
constexpr int kWgmmaM = 64;  // rows of one wgmma: one consumer warpgroup
constexpr int kWgmmaK = 16;  // reduction depth of one 16-bit wgmma

// A CTA is one producer warpgroup and kBlockM / 64 consumer warpgroups (64
// query rows each: the M of one wgmma): two on every tile but the tall d64
// one, which has three (consumer_warpgroups(), below).
constexpr int kMaxConsumerWarpgroups = 3;
// setmaxnreg split per consumer warpgroup count (FlashAttention-3's, with
// TMA loads): two consumers 128 x 24 + 256 x 240 = 64512, three 128 x 32 +
// 384 x 160 = 65536 registers, at most an SM's 65536.
template <int kConsumerWarpgroups>
struct RegisterSplit;
template <>
struct RegisterSplit<2> {
  static constexpr int kProducer = 24, kConsumer = 240;
};
template <>
struct RegisterSplit<3> {
  static constexpr int kProducer = 32, kConsumer = 160;
};
template <int kConsumerWarpgroups>
constexpr bool register_split_fits() {
  using R = RegisterSplit<kConsumerWarpgroups>;
  return kWarpgroupThreads * (R::kProducer + kConsumerWarpgroups * R::kConsumer) <= 65536;
}
static_assert(register_split_fits<2>() && register_split_fits<3>(),
              "register split exceeds the register file");

// Schedule switches of the consumer main loop (consumer.cuh). Each can be
// turned off alone; off gives the previous, simpler schedule.
// - kIntraWarpgroupOverlap: issue S(n) = Q K(n)^T and O += P(n+1) V(n+1)
//   back to back and do the softmax of S(n) while the P V GEMM runs
//   (FlashAttention-3's intra-warpgroup pipelining). Off: every GEMM is
//   waited for before the next step (the first H200 version).
// - kPingPong: the two consumer warpgroups take turns issuing their GEMMs
//   (named barriers, consumer.cuh PingPong), so one warpgroup's softmax runs
//   while the other's GEMMs occupy the tensor cores. Only with
//   kIntraWarpgroupOverlap and only for tiles whose ForwardTile::kPingPongAllowed
//   is set (FlashAttention-3: d <= 128).
// - kFastSoftcap: softcap's tanh with one MUFU op (ex2) and the reciprocal
//   by FMA Newton steps (softcap.cuh) instead of cuda-flash's
//   apply_softcap (ex2 + rcp: two MUFU ops on top of the softmax's ex2).
//   Only for tiles whose ForwardTile::kFastSoftcapAllowed is set.
// - kPersistentScheduler: launch min(tiles, SMs) CTAs (one per SM); each
//   loops over work tiles in a fixed order (tile_coord.cuh TileSchedule:
//   longest-first, serpentine rounds), so the producer loads the next
//   tile's Q and K/V while the consumers finish and store the current one.
//   Off: one CTA per work tile (the same code with one tile per CTA).
// - kWideNonCausalD128: d128 problems with neither causal mask nor window
//   (after mask_args: a window >= Tk is none) use ForwardTile<128, TileShape::kWide>,
//   128 x 176 (FlashAttention-3's kBlockN for d128 non-causal);
//   everything else keeps 128 x 128. Off: the wide kernels are neither
//   chosen nor compiled. kWideSoftcapD128 (only with kWideNonCausalD128):
//   softcap problems take the wide tile too; off: they keep 128 x 128 and
//   the two wide softcap kernels are not compiled. Measured on the H200
//   (docs/hopper.md): without softcap the wide tile gains 4-5% at T8k-T16k
//   (2% at T4k, where the last tile is mostly padding); with softcap it
//   loses 2-5% (the MUFU-bound softmax gains nothing from a longer tile and
//   the consumer is at 238 of 240 registers), hence off. Causal d128 on
//   the wide tile measured slower up to T4k and within the spread at
//   T8k-T16k (docs/hopper.md TODO 2), hence non-causal only.
// - kMulticastKV: the two query heads 2j, 2j + 1 of one kv head (groups of
//   an even number of query heads) work on the same query tile in one
//   cluster of two CTAs, and each K/V tile is copied from global memory
//   once for both: each CTA copies half of its column blocks and the TMA
//   multicasts them into both; only tiles with kMulticastAllowed (d128)
//   and no softcap (multicast_tile()). Off: every CTA copies its own K/V
//   and no cluster kernel is compiled. On since the twenty-first session
//   (docs/hopper.md TODO 0): it halves the K/V reads from L2, which costs
//   energy; at the 700 W cap that is speed. H200, one session, base / on
//   builds interleaved (fwd TFLOP/s): back to back for 2 s (the cap) B1
//   T16k 608, 604 / 617, 617 (NVML 1.140 / 1.108 pJ per FLOP over 600
//   calls), B4 T4k 531, 531 / 536, 533; 30-call bursts T16k 645, 640 /
//   667, 684, T4k 606, 606 / 602, 600, non-causal 636, 642 / 635, 649,
//   T1k 406, 403 / 411, 415, window 1024 475, 474 / 475, 487. In the
//   ninth session's bursts (older kernels) it measured 0-3% slower.
constexpr bool kIntraWarpgroupOverlap = true;
constexpr bool kPingPong = true;
constexpr bool kFastSoftcap = true;
constexpr bool kPersistentScheduler = true;
constexpr bool kWideNonCausalD128 = true;
constexpr bool kWideSoftcapD128 = false;
// kTallD64: d64 problems without softcap or window and with at least
// kTallD64MinKeys keys run on ForwardTile<64, TileShape::kTall>, 192 x 128
// with three consumer warpgroups of 160 registers (FlashAttention-3's d64
// tile). d64's loop has one exponential per score for half d128's tensor
// work and waits on the softmax's dependency chains; a third consumer
// warpgroup gives each SM sub-partition a third warp to hide them, and
// each K/V tile read serves 192 query rows. Measured on the H200
// (2026-12-02, fwd TFLOP/s, interleaved builds in one call, tall / the
// 128 x 192 wide tile it replaced (128 x 128 below 4096 keys and for
// window) / tall / wide): causal B4 T4k 410 / 406 / 407 / 399, causal B1
// T16k 481 / 463 / 484 / 465, non-causal B4 T4k 475 / 438 / 477 / 437;
// but causal B16 T1k 242 / 276 / 243 / 283 (the diagonal tile and the last
// one waste more of 192 rows), window 1024 316 / 316 / 317 / 314 (no
// gain), softcap 30 tall 278 / 128 x 128 272-274 (within the spread, and
// the tall softcap consumers spill 52-68 bytes at 160 registers): hence no
// softcap, no window. Threshold (same day, another call, tall from 2048
// keys / from 4096 / 2048 / 4096): causal B8 T2k 348 / 344 / 345 / 341,
// non-causal B8 T2k 443 / 403 / 445 / 402; from 1024 / 512 / 2048 (x2):
// non-causal B16 T1k 371-374 / 370-375 / 370 and B32 T512 316 / 326-332
// / 318-322 (the spread), and causal B16 T1k 237-239 against 277-280:
// hence Tk >= 2048 then. With the causal tiles end-aligned
// (kEndAlignedCausalTiles) the tall tile's last tile no longer wastes rows
// at T1k, and the threshold moved to 1024 (one call, fwd TFLOP/s, from 2048
// / from 1024 / from 512 / 2048 / 1024): causal B16 T1k 273 / 279 / 283 /
// 278 / 283, non-causal B16 T1k 366 / 375 / 372 / 370 / 374, causal B32
// T512 205 / 208 / 196 / 208 / 204 (tall at 512 loses), causal B8 T2k and
// B4 T4k within the spread, B16 T1000 (below 1024: the control) 258-262
// in all five. The 128 x 192 tile (kWideD64 until then) measured below the
// tall one on every problem it ran and was removed. Off: the tall kernels
// are neither chosen nor compiled.
constexpr bool kTallD64 = true;
constexpr int kTallD64MinKeys = 1024;
// The tall tile also needs this many queries (0: any). Its 192 rows serve
// short query ranges badly: a packed decoding tile (Tq 1, G 4) holds 4
// useful rows, so two of its three consumer warpgroups compute padding, and
// the tall tile has no ping-pong. Host time out, d64 decoding (B8 Tq1 Tk8k
// H32/8) takes 75 us on it, as long as d128 on its own tile, against
// cuDNN's 39 (docs/performance.md, forty-first session). 192 would put
// every problem whose queries do not fill one tall tile (all packed ones)
// on the 128-row tile; not measured yet (docs/hopper.md TODO 1).
constexpr int kTallD64MinQueries = 0;
constexpr bool kMulticastKV = true;
// kTmaStoreOutput: the epilogue (epilogue.cuh) writes each warpgroup's 64
// rows of O, rounded, into a staging area of shared memory in the swizzled
// layout of the O map, and one thread stores them by TMA, so the consumers
// go on to the next work tile at once; where the tile's shared memory has
// room (ForwardTile::kStageOutputAllowed) and o meets TMA's alignment
// (ForwardParams::o_by_tma, decided on the host). Otherwise, and off: plain
// 32-bit stores from registers, which a warp issues as 32 (d128) scattered
// 16-byte pieces of 8 rows each. The cost it attacks, measured on the
// H200 by skipping the stores (wrong results; fwd TFLOP/s, base / no O
// stores): causal B16 T1k 408 / 456, window 1024 474 / 513, causal T4k 600
// / 627, d64 T4k 402 / 400: short rows pay most (an epilogue per 4-9 key
// tiles).
constexpr bool kTmaStoreOutput = true;
// kStmatrixStaging: O's staging (kTmaStoreOutput) and its per-warp chunks
// (kWarpChunkOutput) write the rounded accumulator into shared memory with
// stmatrix.x4, four 8 x 8 matrices per instruction (staged_store.cuh
// stage_rows, epilogue.cuh store_output_by_warp_chunks; the backward's
// switch is backward_tile_sizes.hpp kBwdStmatrixStaging), instead of one
// 32-bit store per pair: a quarter of the instructions, the same bytes at
// the same places. H200 (fwd TFLOP/s, mean of six runs on / three off,
// 100 calls each): d64 causal B4 T4k 454 / 447 (ranges apart); d128
// causal B16 T1k 433 / 437, T4k and d256 within their spread
// (docs/hopper.md forward TODO 11).
constexpr bool kStmatrixStaging = true;
// kWarpChunkOutput: where a tile has no room to stage O for TMA (the wide
// d128 tile, d256), each consumer warp passes its 16 rows through a 1 KB
// chunk of shared memory of its own, 32 columns at a time, so that they
// leave as 16-byte stores, 64 contiguous bytes per row and quad, in place
// of the 32-bit stores above; where o's rows are 16-byte aligned
// (ForwardParams::o_by_16_byte_stores), and not under softcap
// (epilogue.cuh chunks_output). The cost it attacks, measured on the H200
// by never taking the store (its code kept behind a branch the kernel
// cannot prove dead; wrong results; fwd TFLOP/s, two builds each,
// thirty-fifth session): d256 causal B4 T4k 661 / 720 (8.9%), against
// 1.0% at d128 T4k and T16k where O goes by TMA. Chunks / 32-bit stores
// (two calls, two builds each): d256 causal B4 T4k 687, 686, 689, 692 /
// 652, 655, 657, 660; d256 non-causal 749, 749 / 731, 688; wide d128
// non-causal 617, 611 / 588, 614 (within the spread). Under softcap the
// d256 window 4096 softcap 50 kernel ran slower with chunks (559-578
// against 578-625), and d128 wide softcap 30 480, 480 against 483, 493:
// its kernels keep the 32-bit stores (in that form d256 630, 632; d128
// wide softcap 30 486, 485).
constexpr bool kWarpChunkOutput = true;
// kKvGroupedOrder: the work tiles of problems with neither causal mask nor
// window (all equally long) run in tile_order.hpp's kv-grouped order,
// ForwardTile::kKvGroupPairs (batch, kv head) pairs at a time, so that the
// CTAs of a round share the K/V of a few pairs in L2; off (or a tile's 0):
// every problem in the longest-first order. Measured on the H200 (fwd
// TFLOP/s, non-causal B4 T4k, one call, 8 pairs / off / 4 pairs / 8 / off):
// d128 648 / 626 / 649 / 645 / 600, d256 H16/8 745 / 698 / 755 / 745 /
// 673, d64 434 / 440 / 430 / 433 / 441 (hence 0 for d64); B1 T16k d128
// (8 pairs in all) and causal T4k (longest first) within the spread.
constexpr bool kKvGroupedOrder = true;
// kQInRegisters: S = Q K^T takes Q from registers (wgmma RS, the A fragments
// loaded once per work tile with ldmatrix) instead of shared memory, on
// tiles with kQInRegistersAllowed and without softcap (q_in_registers()).
// Why: per 128 x 128 key tile the two consumer warpgroups read 160 KB of
// operands from shared memory (Q 2 x 16, K 2 x 32, V 2 x 32) while the TMA
// writes 64 KB into it, about 109 bytes per clock of the 2048 clocks of
// tensor work at 128 bytes per clock per SM; Q from registers takes 32 KB
// off that (d64: the same rates, 16 of 112 KB per tile). The cost: d / 4
// registers per consumer thread (the d128 plain kernel uses 184 of 240, the
// d64 one 152; softcap 238, the wide d128 tile 220 and the tall d64 tile's
// 160-register consumers have no room).
// Measured on the H200 (2026-11-30, fwd TFLOP/s, one call, on / off / on /
// off, interleaved builds; the 64 forward tests pass with it on): d128
// causal T1k 420 / 413 / 421 / 415, T4k 608 / 602 / 614 / 603, T16k 615 /
// 660 / 659 / 612 (the spread), window 1024 494 / 487 / 495 / 485, d64 T4k
// 400 / 399 / 403 / 399. A steady 1-2%, on.
constexpr bool kQInRegisters = true;
// kLazyRescale: FlashAttention-4's lazy rescaling in the running-maximum
// softmax (flash/softmax.cuh OnlineSoftmax::scores_to_p): a warp keeps its
// rows' reference maxima while no row's maximum grew by more than
// 2^ForwardTile::kLazyRescaleLog2 (in exp2 units), so those key tiles skip
// O's rescale (d / 2 multiplies per thread between the P V GEMM's
// retirement and the next issue) and alpha's exponential. Off: every tile
// rescales. Threshold 0 (d64, d128): a tile is skipped only where no row
// of the warp changed its maximum, bit for bit the eager results. Threshold
// 8 (d256): skips on most tiles, and the softmax compensates the 16-bit
// rounding of the then inexact largest p (kCompensate), without which o
// carries an error common to its columns that the backward's D amplifies.
// Measured on the H200 (2026-12-01, fwd TFLOP/s, interleaved builds in one
// call; all numbers in docs/hopper.md TODO 7): threshold 0 against off,
// d256 643 / 631, softcap 60 374 / 369, d128 causal T4k 606 / 604;
// threshold 8 compensated against 0, d256 676 / 655 but d128 causal T4k
// 608 / 615 and softcap 60 359 / 374 (one exponential per row and tile
// pays for d256's 128 skipped multiplies, not for d128's 64).
constexpr bool kLazyRescale = true;

// The no-offset softcap softmax (flash/score_mode.hpp) forms its exponents
// mult tanh(s pre) by flash/softcap_poly.hpp's polynomial, no MUFU op, on
// every key tile where all of a warp's raw scores have |s pre| <= 0.625
// (one vote per tile), else by the MUFU form of kTwoMufuSoftcapExponents
// (the running-maximum softcap mode, f16 or cap > 52.68, its tanh likewise);
// for tiles whose ForwardTile::kSoftcapPolyAllowed is set (d64, d128).
// Off: always the MUFU form (the poly branch is not compiled). H200, one
// call, two builds each (fwd TFLOP/s, on for every d / off): d128 causal
// cap30 B4 T4k 423, 439 / 411, 411, B1 T16k 474, 474 / 445, 446,
// non-causal 466, 463 / 438, 438; d64 causal cap30 282, 280 / 233, 231;
// d256 causal w4096 cap50 B2 T8k 546, 609 / 587, 636 (hence not d256).
// The running-maximum mode, f16 (on, twice / off): d128 causal cap30 B4
// T4k 375, 380 / 340, B1 T16k 410, 411 / 371; d64 241, 241 / 204.
// The bench's inputs (N(0.5, 1)) give logits far inside the range; logits
// beyond 0.625 cap run as before.
constexpr bool kSoftcapPoly = true;
// kEndAlignedCausalTiles: under a causal mask the query tiles are aligned
// to the end of the sequence, not its start (tile_coord.cuh
// query_tile_shift): where Tq is not a multiple of kBlockM the part-empty
// tile is the first, which visits the fewest key tiles, instead of the
// last, which visits them all. The shift is a whole number of warpgroups'
// rows (64), so a warpgroup's rows are all before row 0 (no key, no store)
// or none are; Q rows before 0 come from TMA's zero fill. The d64 tall tile
// at T4k (22 tiles of 192 for 4096 rows) visits 363 key tiles per head
// instead of 384 (-5.5%), at T16k 1.5% fewer; tiles of 128 rows at T a
// multiple of 128 are unchanged. Off: the tiles start at row 0.
// Measured on the H200 (2026-12-02, one call, fwd TFLOP/s, on / off / on /
// off): d64 causal B4 T4k 444 / 419 / 444 / 417, B1 T16k 522 / 486 / 494 /
// 484, B8 T3000 402 / 392 / 401 / 392; d128 causal B4 T4000 (64 rows
// before 0) 582 / 574 / 551 / 587, the spread; d128 T4096 (no shift) 615 /
// 605 / 619 / 619.
constexpr bool kEndAlignedCausalTiles = true;

// The tile shapes a head dimension may have besides its default.
enum class TileShape { kDefault, kWide, kTall };

// ForwardTile<kD, kShape>: kD the head dimension; kShape the default, the
// wide key tile (<128, kWide>) or the tall tile (<64, kTall>), used as
// forward_shape() says.
// kMulticastAllowed: the tile may take K/V multicast (kMulticastKV).
// kLazyRescaleLog2: lazy rescaling's threshold (kLazyRescale).
// kKvGroupPairs: (batch, kv head) pairs per group of the kv-grouped tile
// order (kKvGroupedOrder); 0: longest first always.
// kQInRegistersAllowed: the tile may take Q from registers (kQInRegisters).
// kStageOutputAllowed: the tile has shared memory left for O's staging area
// (kBlockM x d, kTmaStoreOutput): not the wide d128 tile (208 KB without
// it) nor d256 (192 KB, and 64 KB more for O).
// kFmaExp2QuartersPlain / kFmaExp2QuartersSoftcap: of every four n8 blocks
// of P, how many take their exponentials on the FMA pipe
// (fused::exp2_fma) instead of the MUFU, without and with softcap. The
// MUFU gives 16 results per clock per SM and under softcap computes three
// ops per score (tanh's ex2 and rcp, P's ex2). 0 everywhere: all on the
// MUFU, the kernels as before. Measured on the H200 (fwd TFLOP/s, d128
// causal cap30 B4 T4k, one call, quarters 0 / 1 / 2 / 3): 418 / 421 / 414
// / 409 (a second build of 2: 414); the forward tests passed with 2 (64 of
// 64). Each exponential moved costs 8-9 FMA/ALU instructions. The
// profile (docs/hopper.md TODO 4) shows the MUFU at 68% of its peak there,
// near but not at its bound; the rest is the dependency chain, which the
// longer FMA form lengthens. d64 without softcap, quarters 0 / 1 / 2:
// causal T4k 397 / 389 / 360 (slower throughout).
// kTwoMufuSoftcapExponents: under ScoreMode::softcap_without_row_max, the
// exponents in cuda-flash's two-MUFU form (softcap.cuh): fewer
// instructions, one more MUFU op per score. Measured on the H200 (fwd
// TFLOP/s, causal cap30 B4 T4k, one-MUFU / two-MUFU): d128 402 / 432, d64
// 239 / 227 (half d128's tensor work per score: the MUFU pipe bounds it).
template <int kD, TileShape kShape = TileShape::kDefault>
struct ForwardTile;
template <>
struct ForwardTile<64> {
  static constexpr int kD = 64, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr int kKvGroupPairs = 0;  // 8: 1-2% slower (non-causal B4 T4k, 128 x 192)
  static constexpr int kLazyRescaleLog2 = 0;
  static constexpr bool kQInRegistersAllowed = true;
  static constexpr int kFmaExp2QuartersPlain = 0, kFmaExp2QuartersSoftcap = 0;
  static constexpr bool kPingPongAllowed = true;
  static constexpr bool kMulticastAllowed = false;  // one column block: nothing to split
  static constexpr bool kFastSoftcapAllowed = true;
  static constexpr bool kTwoMufuSoftcapExponents = false;
  static constexpr bool kSoftcapPolyAllowed = true;
  static constexpr bool kStageOutputAllowed = true;
};
// A wide or tall tile is its head dimension's default with more key or
// query rows (and what that costs in registers): every other property is
// the default's.
// 192 x 128, three consumer warpgroups at 160 registers (kTallD64): S 64
// f32 per consumer thread, P 32 packed registers, O 32; R0-R157 of 160
// (ptxas 13.0, 8 bytes of spills, 16 with ping-pong: values stored before
// the work-tile loop and reloaded once per work tile in the epilogue,
// outside the key loop, SASS), no room for Q. Without ping-pong: the
// three warpgroups issue their GEMMs as they come. Measured on the H200
// (2026-12-02, fwd TFLOP/s, one call, interleaved builds, without / with
// the round robin of kPingPong / a 3-slot K/V ring, twice each): causal
// B4 T4k 417, 418 / 413, 413 / 408, 408; causal B1 T16k 489, 488 / 477,
// 476 / 472, 485; non-causal B4 T4k 482, 481 / 478, 475 / 466, 475.
template <>
struct ForwardTile<64, TileShape::kTall> : ForwardTile<64> {
  static constexpr int kBlockM = 192;
  static constexpr bool kQInRegistersAllowed = false;
  static constexpr bool kPingPongAllowed = false;
};
template <>
struct ForwardTile<128> {
  static constexpr int kD = 128, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr int kKvGroupPairs = 8;
  static constexpr int kLazyRescaleLog2 = 0;
  static constexpr bool kQInRegistersAllowed = true;
  static constexpr int kFmaExp2QuartersPlain = 0, kFmaExp2QuartersSoftcap = 0;
  static constexpr bool kPingPongAllowed = true;
  static constexpr bool kMulticastAllowed = true;
  static constexpr bool kFastSoftcapAllowed = true;
  static constexpr bool kTwoMufuSoftcapExponents = true;
  static constexpr bool kSoftcapPolyAllowed = true;
  static constexpr bool kStageOutputAllowed = true;
};
// 128 x 176: S is 88 f32 per consumer thread (m64n176k16), P 44 packed
// registers (11 k16 steps of the P V GEMM), O 64; at 220 of 240 registers
// no room for Q (d / 4 more).
template <>
struct ForwardTile<128, TileShape::kWide> : ForwardTile<128> {
  static constexpr int kBlockN = 176;
  static constexpr bool kQInRegistersAllowed = false;
  static constexpr bool kStageOutputAllowed = false;
};
template <>
struct ForwardTile<256> {
  static constexpr int kD = 256, kBlockM = 128, kBlockN = 64, kStages = 2;
  static constexpr int kKvGroupPairs = 8;
  static constexpr int kLazyRescaleLog2 = 8;
  static constexpr bool kQInRegistersAllowed = false;
  static constexpr int kFmaExp2QuartersPlain = 0, kFmaExp2QuartersSoftcap = 0;
  static constexpr bool kPingPongAllowed = false;   // FlashAttention-3: no ping-pong for d256
  static constexpr bool kMulticastAllowed = false;  // measured slower (kMulticastKV)
  // With O (128 registers) and P in flight during the softmax, the longer
  // tanh spills 9 registers (ptxas 13.0); d256's softmax has half the
  // elements per GEMM FLOP of d128, so the MUFU pipe does not bound it.
  static constexpr bool kFastSoftcapAllowed = false;
  static constexpr bool kTwoMufuSoftcapExponents = true;
  // Measured slower with the polynomial tanh (kSoftcapPoly): not MUFU-bound.
  static constexpr bool kSoftcapPolyAllowed = false;
  static constexpr bool kStageOutputAllowed = false;
};

// Whether head dimension d has a tile of `shape` for softcap on or off at
// all: which kernels the launchers instantiate.
constexpr bool has_tile(int d, TileShape shape, bool softcap) {
  switch (shape) {
    case TileShape::kWide: return kWideNonCausalD128 && d == 128 && (!softcap || kWideSoftcapD128);
    case TileShape::kTall: return kTallD64 && d == 64 && !softcap;
    default: return true;
  }
}
// The tile a problem runs on. causal, window (0: none), tq and tk are
// MaskArgs', softcap ScoreArgs', so the host (TMA box rows, shared memory,
// query tiles) and the launcher (kernel instance) decide alike.
constexpr TileShape forward_shape(int d, bool causal, int window, int tq, int tk, bool softcap) {
  if (window != 0) return TileShape::kDefault;
  if (has_tile(d, TileShape::kTall, softcap) && tk >= kTallD64MinKeys && tq >= kTallD64MinQueries)
    return TileShape::kTall;
  if (has_tile(d, TileShape::kWide, softcap) && !causal) return TileShape::kWide;
  return TileShape::kDefault;
}

// The CTA's thread layout on `Tile`: a producer warpgroup and one consumer
// warpgroup per 64 query rows, with their setmaxnreg split.
template <class Tile>
constexpr int consumer_warpgroups() {
  return Tile::kBlockM / kWgmmaM;
}
template <class Tile>
constexpr int forward_threads() {
  return (1 + consumer_warpgroups<Tile>()) * kWarpgroupThreads;
}
template <class Tile>
using TileRegisters = RegisterSplit<consumer_warpgroups<Tile>()>;

// The share (in quarters of the n8 blocks) of a tile's P exponentials on
// the FMA pipe, under softcap or not.
template <class Tile>
constexpr int forward_fma_exp2_quarters(bool softcap) {
  return softcap ? Tile::kFmaExp2QuartersSoftcap : Tile::kFmaExp2QuartersPlain;
}

// Whether S = Q K^T takes Q from registers on `Tile` under softcap on or
// off (kQInRegisters).
template <class Tile>
constexpr bool q_in_registers(bool softcap) {
  return kQInRegisters && Tile::kQInRegistersAllowed && !softcap;
}

// CTAs per cluster when K/V are multicast (kMulticastKV), and whether a tile
// under softcap on or off is: the tile allows it and its column blocks split
// evenly between the cluster's CTAs.
constexpr int kMulticastCtas = 2;
template <class Tile, bool kSoftcap>
constexpr bool multicast_tile() {
  return kMulticastKV && Tile::kMulticastAllowed && !kSoftcap &&
         (Tile::kD / kColBlock) % kMulticastCtas == 0;
}
// CTAs per cluster for a problem on `Tile` (softcap kSoftcap) with H query
// and Hkv kv heads: kMulticastCtas when the tile is multicast and every GQA
// group has an even number of query heads (heads 2j, 2j + 1 share a kv
// head), else 1.
template <class Tile, bool kSoftcap>
constexpr int forward_cluster_ctas(int H, int Hkv) {
  return multicast_tile<Tile, kSoftcap>() && Hkv > 0 && (H / Hkv) % kMulticastCtas == 0
             ? kMulticastCtas
             : 1;
}

// Whether the epilogue of `Tile` stages O for a TMA store (kTmaStoreOutput).
template <class Tile>
constexpr bool stages_output() {
  return kTmaStoreOutput && Tile::kStageOutputAllowed;
}
// Whether `Tile` has room for per-warp chunks of O (kWarpChunkOutput): 16
// rows x 32 columns of 16-bit elements per warp, where it does not stage O.
template <class Tile>
constexpr bool reserves_output_chunks() {
  return kWarpChunkOutput && !stages_output<Tile>();
}
constexpr int kOutChunkRows = 16;  // a warp's rows of the wgmma accumulator
constexpr int kOutChunkCols = 32;  // 64 bytes per row: two full 32-byte sectors
constexpr uint32_t kOutChunkBytes = uint32_t(kOutChunkRows) * kOutChunkCols * kElemBytes;

// Byte offsets of one CTA's shared memory, from a 1024-byte aligned base:
// Q, then kStages K slots, then kStages V slots (each slot a whole tile, so
// every tile starts on a swizzle-atom boundary), then the mbarriers, then
// (atom-aligned) a tile of ones, then O's staging area: where
// stages_output() per consumer warpgroup a K-major [64 x d] tile, where
// reserves_output_chunks() per consumer warp one chunk (kOutChunkBytes).
template <class Tile>
struct SmemLayout {
  static constexpr int kD = Tile::kD;
  static constexpr uint32_t kQBytes = uint32_t(Tile::kBlockM) * kD * kElemBytes;
  static constexpr uint32_t kKVBytes = uint32_t(Tile::kBlockN) * kD * kElemBytes;  // one slot
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kK = kQ + kQBytes;
  static constexpr uint32_t kV = kK + Tile::kStages * kKVBytes;
  static constexpr uint32_t kBarriers = kV + Tile::kStages * kKVBytes;
  // mbarriers (8 bytes each): q_full, then per stage k_full, k_empty, v_full,
  // v_empty, then q_empty (the consumers are done with Q: the persistent
  // producer may load the next tile's).
  static constexpr uint32_t kBarrierBytes = 8;
  static constexpr uint32_t kQFull = kBarriers;
  static constexpr uint32_t kKFull = kQFull + kBarrierBytes;
  static constexpr uint32_t kKEmpty = kKFull + Tile::kStages * kBarrierBytes;
  static constexpr uint32_t kVFull = kKEmpty + Tile::kStages * kBarrierBytes;
  static constexpr uint32_t kVEmpty = kVFull + Tile::kStages * kBarrierBytes;
  static constexpr uint32_t kQEmpty = kVEmpty + Tile::kStages * kBarrierBytes;
  // A tile of ones (16-bit 1.0, 16 rows of 128 bytes, two swizzle atoms):
  // the B operand of P times ones, the row sums of the 16-bit P under
  // ScoreMode::softcap_without_row_max (consumer.cuh); unused otherwise.
  static constexpr uint32_t kOnesBytes = 2 * kSwizzleAtomBytes;
  static constexpr uint32_t kOnes =
      (kQEmpty + kBarrierBytes + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr uint32_t kOutWarpgroupBytes = uint32_t(kWgmmaM) * kD * kElemBytes;
  static constexpr uint32_t kOut = kOnes + kOnesBytes;
  static constexpr uint32_t kOutBytes =
      stages_output<Tile>() ? uint32_t(consumer_warpgroups<Tile>()) * kOutWarpgroupBytes
      : reserves_output_chunks<Tile>()
          ? uint32_t(consumer_warpgroups<Tile>()) * kWarpsPerWarpgroup * kOutChunkBytes
          : 0;
  static constexpr uint32_t kEnd = kOut + kOutBytes;
  // Dynamic shared memory is only guaranteed 16-byte aligned: ask for one
  // atom more and round the base up.
  static constexpr std::size_t kAllocBytes = std::size_t(kEnd) + kSwizzleAtomBytes;

  // Every column block ([rows][64], rows x 128 bytes) must start on a
  // 1024-byte boundary too: rows a multiple of 8 (176 rows: 22 atoms).
  static_assert(Tile::kBlockM % 8 == 0 && Tile::kBlockN % 8 == 0,
                "column blocks must start on 1024-byte boundaries");
  static_assert(kQBytes % kSwizzleAtomBytes == 0 && kKVBytes % kSwizzleAtomBytes == 0 &&
                    kOut % kSwizzleAtomBytes == 0 && kOutWarpgroupBytes % kSwizzleAtomBytes == 0,
                "tiles must start on 1024-byte boundaries");
  static_assert(Tile::kBlockM % kWgmmaM == 0 &&
                    consumer_warpgroups<Tile>() <= kMaxConsumerWarpgroups,
                "one consumer warpgroup per 64 query rows");
  static_assert(kD % kColBlock == 0, "head dimension must be a multiple of 64");
  // A TMA box and a wgmma N have at most 256 rows; P V walks S in k16 steps.
  static_assert(Tile::kBlockM <= 256 && Tile::kBlockN <= 256, "a TMA box has at most 256 rows");
  static_assert(Tile::kBlockN % kWgmmaK == 0, "kBlockN must be a whole number of k16 steps");
};

template <class Tile>
constexpr std::size_t forward_smem_bytes() {
  return SmemLayout<Tile>::kAllocBytes;
}
// Under the H100/H200 opt-in of 227 KB: 128 x 128 d128: 160 KB + barriers
// + 2 KB of ones + 32 KB of O staging; 128 x 176: Q 32 KB + 2 x 44 KB K +
// 2 x 44 KB V = 208 KB + barriers + ones + 8 KB of O chunks (of 16 KB
// left: hence 32-column chunks); d256: Q 64 KB + 2 x 32 KB K + 2 x 32 KB
// V = 192 KB + barriers + ones + 8 KB of O chunks.
constexpr std::size_t kSm90SmemOptinBytes = 227 * 1024;
static_assert(forward_smem_bytes<ForwardTile<64>>() <= kSm90SmemOptinBytes &&
                  forward_smem_bytes<ForwardTile<64, TileShape::kTall>>() <= kSm90SmemOptinBytes &&
                  forward_smem_bytes<ForwardTile<128>>() <= kSm90SmemOptinBytes &&
                  forward_smem_bytes<ForwardTile<128, TileShape::kWide>>() <= kSm90SmemOptinBytes &&
                  forward_smem_bytes<ForwardTile<256>>() <= kSm90SmemOptinBytes,
              "a forward tile exceeds sm_90's shared memory");

// What the host needs of the tile a problem runs on (forward_shape()): the
// query rows of a work tile (the Q map's box, the grid), the key rows (the
// K/V maps' box) and the shared memory (why_not's check).
struct ForwardTileDims {
  int block_m = 0, block_n = 0;
  std::size_t smem_bytes = 0;
};
template <class Tile>
constexpr ForwardTileDims dims_of() {
  return ForwardTileDims{Tile::kBlockM, Tile::kBlockN, forward_smem_bytes<Tile>()};
}
// d in {64, 128, 256}; shape as forward_shape() gives it for d.
constexpr ForwardTileDims forward_tile_dims(int d, TileShape shape) {
  if (d == 64)
    return shape == TileShape::kTall ? dims_of<ForwardTile<64, TileShape::kTall>>()
                                     : dims_of<ForwardTile<64>>();
  if (d == 128)
    return shape == TileShape::kWide ? dims_of<ForwardTile<128, TileShape::kWide>>()
                                     : dims_of<ForwardTile<128>>();
  return dims_of<ForwardTile<256>>();
}

}  // namespace gqattn::hopper
