// cuda-flash: tile shapes per head dimension for the three kernels, and the
// shared memory each needs (the backend compares forward_smem_bytes and
// backward_min_smem_bytes, with d's smallest dK/dV tile, with the device's
// opt-in limit, per pass; dkdv_tile_for_device picks the tile that runs).
// Plain C++ so the host side can use it; the kernels
// static_assert the shapes they rely on. Checked by compiling, by
// tests/cpu/test_flash_tile_choice.cpp and test_flash_dq_default.cpp, and by
// the kernels' tests (tests/gpu/test_flash_*.cpp cover d 64, 128, 256).
//
// Choices (FlashAttention-2's shapes, adjusted to keep every accumulator in
// registers; each departure from the earlier shape has a switch and the
// measurement that decided it):
// - forward: a CTA owns kBlockM query rows, kWarps warps of kBlockM/kWarps
//   rows each (d64, d128: two m16 tiles per warp, so each K/V fragment
//   loaded from shared memory feeds two mma; d256: one); key tiles of
//   kBlockN, K and V single-buffered and staggered (V(n) loads during
//   S = Q K^T, K(n-1) during softmax and P V).
// - dK/dV: a CTA owns kBlockN keys of one kv head; warps are a kWarpsN x
//   kWarpsD grid, each warp kKeyTilesPerWarp m16 tiles of keys x
//   (d / kWarpsD) columns of dK and dV; query tiles of kBlockM in
//   kQueryStages buffers (2; 1 on the small-shared-memory tiles of d128 and
//   d256; d256's smallest tile also keeps V in registers). With kWarpsD == 1
//   P^T and dS^T stay in registers as the
//   A operand of dV += P^T dO and dK += dS^T Q; otherwise (d128, d256, where
//   a warp's keys x d accumulators would not fit) they go through shared
//   memory.
// - dQ, three strategies (DqStrategy, chosen per call by the backend, see
//   flash_backend.cpp; the first two deterministic):
//   separate: a dQ kernel: a CTA owns kBlockM query rows (d64, d128: 32 per
//     warp; d256: 16); key tiles of kBlockN double-buffered; recomputes S
//     and dP (7 GEMMs per tile pair in all).
//   ordered: the dK/dV kernel also computes each step's dQ partial
//     dS (kBlockM x kBlockN) K (through a dS^T tile in shared memory) and
//     adds it into an f32 accumulator [B*H, tq_padded, d] (fragment-major:
//     dq_accum_layout.hpp) in ascending
//     key-tile order, enforced by one counter per (b, h, query tile)
//     (5 GEMMs); a postprocess kernel scales and converts it.
//   atomic: the same kernels without counters: every partial is red.add-ed
//     into the zeroed accumulator in hardware order. Not deterministic:
//     only for Options::deterministic == false.
#pragma once

#include <algorithm>
#include <cstddef>

namespace gqattn::flash {

constexpr int kElemBytes = 2;  // bf16 and f16

template <int kD>
struct ForwardTile;
template <>
struct ForwardTile<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4;
  static constexpr bool kLazyRescale = false;  // see kForwardLazyRescale
};
// d128: 4 warps x 32 rows (two m16 tiles) on 64-key tiles, FlashAttention-2's
// sm90 shape: half the shared memory read per FLOP of 8 warps x 16 rows
// (each K/V fragment feeds two mma; per 16 rows x 64 keys: K+V 16 KB + Q
// 8 KB instead of 32 KB + 4 KB), which bounds the mma.sync loop on
// H100/H200 (128 B/clk). O 128 + S 64 f32 registers: ptxas spills the four
// row sums across the loop's back edge (4 STL + 4 LDL per 64 keys); still
// 8% faster than 32-key tiles, which fit (T4k 271 -> 293 TFLOP/s, H200).
// Set to false for the previous 8 warps x 16 rows.
constexpr bool kForwardD128TwoTilesPerWarp = true;
// kForwardLazyRescale: on tiles whose kLazyRescale is set, the forward's
// online softmax rescales O only when a row of the warp outgrew its
// reference maximum (softmax.cuh, FlashAttention-4's lazy rescaling, at
// OnlineSoftmax's threshold 0 here). Off: every key tile rescales O (the
// kernels SASS-identical to those before the switch existed).
// Measured on the H200 at threshold 8 (2026-12-01, fwd TFLOP/s, one call,
// interleaved builds lazy / off / lazy / off, every tile lazy): d128 causal B4 T4k 365 /
// 361 / 366 / 364, B1 T16k 384 / 370 / 381 / 373, non-causal 373 / 373 /
// 376 / 372, window 1024 314 / 316 / 312 / 310; but d64 294 / 307 / 296 /
// 305 and d256 315 / 325 / 315 / 327 (there the rescale's multiplies fill
// issue slots the mma.sync loop leaves idle, and the vote and branch cost
// more than they save). Hence d128 only, if on. Off for the reason
// cuda-hopper's kLazyRescale is (hopper/tile_sizes.hpp): o divided by the
// f32 sums of a stale reference carries a common error that the backward's
// D amplifies. The flash tests passed with it on. OnlineSoftmax now cures
// that with its kCompensate (cuda-hopper's d256 uses it), but cuda-flash's
// kernel instantiates the softmax at threshold 0 (bitwise eager), with
// which it has not been measured: its d128 gain came from the skips a
// threshold of 8 allows, and at 8 the compensation costs an exponential
// per row and tile (cuda-hopper d128: slower than threshold 0).
constexpr bool kForwardLazyRescale = false;
template <>
struct ForwardTile<128> {
  static constexpr int kBlockM = 128, kBlockN = 64;
  static constexpr int kWarps = kForwardD128TwoTilesPerWarp ? 4 : 8;
  static constexpr bool kLazyRescale = kForwardLazyRescale;
};
template <>
struct ForwardTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4;
  static constexpr bool kLazyRescale = false;  // see kForwardLazyRescale
};

// dK/dV, d128: warps 4 (keys, 32 each: two m16 tiles) x 2 (dK/dV columns,
// 64 each; S^T / dP^T queries, 32 each), P^T and dS^T through shared memory,
// instead of 8 warps x 16 keys with P^T, dS^T in registers. Per step every
// warp of the 8 x 1 grid read the whole Q and dO tiles for each of its four
// products (72 KB per warp, 576 KB per step); the 4 x 2 grid reads 60 KB per
// warp including the P^T / dS^T round trip (480 KB). dK 64 + dV 64 + S^T 32
// + dP^T 32 f32 registers per thread. (d64 on 64-query tiles read 288 KB
// per step either way; its 128-query tile below is 4 x 2 too.) Set to
// false for 8 x 1.
constexpr bool kDkdvD128SplitWarps = true;
// kSize: the default tile, or a smaller one for devices whose shared memory
// per block is too small for it (dkdv_tile_for_device, below): kSmall for
// d64, d128 (sm86 / sm89) and d256 (sm80), kSmaller for d256 on sm86 /
// sm89.
// kQueryStages: Q, dO, lse2 and D double-buffered (2: step t+1's loads are
// issued when step t opens) or single-buffered (1: issued once every warp
// is past step t's dV / dK products, so they overlap only its dQ partial;
// the kernel has that path for kWarpsD > 1 only).
// kFusedDqOnly: no separate dQ kernel beside this tile (the backend runs
// ordered or atomic dQ with it; its dK/dV kernel without fused dQ is not
// instantiated). kVInRegisters: V's fragments stay in registers and P^T,
// dS^T use V's shared memory.
enum class DkdvTileSize { kDefault, kSmall, kSmaller };
template <int kD, DkdvTileSize kSize = DkdvTileSize::kDefault>
struct DkdvTile;
// Fused (ordered or atomic) dQ partial dS K in the dK/dV kernel, d128 and
// d256: warps 2 (queries, 32 each: two m16 tiles) x 4 (columns) instead of
// 4 x 2 with 16 queries each, so each K fragment read from shared memory
// feeds two mma: per step a warp reads dS^T and K tiles of 16 KB instead of
// 24 KB at d128 (d256: 16 instead of 24), FlashAttention-2's dQ layout.
// d64 reads 12 KB either way and keeps one m16 tile. Set to false for one.
constexpr bool kFusedDqTwoRowTiles = true;
// d64: query tiles of 128 on warps 4 (keys, 32 each) x 2 (dK/dV columns, 32
// each; S^T / dP^T queries, 64 each), FlashAttention-2's d64 shape, instead
// of 64-query tiles on 8 x 1 warps with P^T, dS^T in registers. Half the
// steps per key tile, so half the per-step work that is not mma (barriers,
// loads, lse2 / D, the ordered dQ chain's counters); dK 32 + dV 32 + S^T 64
// + dP^T 64 f32 registers (255, no spills; softcap 4 bytes). H200, one
// call, bwd TFLOP/s, 64 x 8x1 / 128 x 8x1 / 128 x 4x2, ordered dQ: causal
// B4 T4k 209 / 238 / 242, B16 T1k 169 / 191 / 198, B1 T16k 222 / 251 /
// 258, non-causal 215 / 246 / 249, window 1024 181 / 205 / 209, softcap
// 30 194 / 206 / 194 (separate dQ, the old default: 218, 182, 231, 225,
// 188, 181 on the 64 x 8x1 tile). It needs 162 KB of shared memory per
// block (sm80 allows 163, sm86 and sm89 99): where it does not fit, the
// 64-query tile (DkdvTile<64, true>, 81 KB) runs instead. Set to false for
// 64 x 8x1 everywhere.
constexpr bool kDkdvD64QueryTile128 = true;
template <>
struct DkdvTile<64, DkdvTileSize::kSmall> {
  static constexpr int kBlockN = 128, kBlockM = 64, kWarpsN = 8, kWarpsD = 1;
  static constexpr int kKeyTilesPerWarp = 1;
  static constexpr int kDqRowTilesPerWarp = 1;
  static constexpr int kQueryStages = 2;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};
template <>
struct DkdvTile<64> {
  static constexpr int kBlockN = 128;
  static constexpr int kBlockM = kDkdvD64QueryTile128 ? 128 : 64;
  static constexpr int kWarpsN = kDkdvD64QueryTile128 ? 4 : 8;
  static constexpr int kWarpsD = kDkdvD64QueryTile128 ? 2 : 1;
  static constexpr int kKeyTilesPerWarp = kDkdvD64QueryTile128 ? 2 : 1;
  static constexpr int kDqRowTilesPerWarp = kDkdvD64QueryTile128 ? 2 : 1;
  static constexpr int kQueryStages = 2;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};
template <>
struct DkdvTile<128> {
  static constexpr int kBlockN = 128, kBlockM = 64;
  static constexpr int kWarpsN = kDkdvD128SplitWarps ? 4 : 8;
  static constexpr int kWarpsD = kDkdvD128SplitWarps ? 2 : 1;
  static constexpr int kKeyTilesPerWarp = kDkdvD128SplitWarps ? 2 : 1;
  static constexpr int kDqRowTilesPerWarp = kFusedDqTwoRowTiles ? 2 : 1;
  static constexpr int kQueryStages = 2;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};
// d128 for devices below the default tile's 161 KB per block (sm86 and sm89
// allow 99 KB; sm80's 163 KB fit the default): 64 keys x 64 queries on 4 x 2
// warps of one m16 key tile, single-buffered: K, V 32 KB + Q, dO 32 KB + P^T,
// dS^T 16 KB (80.5 KB), where double-buffering would need 113 KB.
// FlashAttention-2 takes 64 x 64 there too (double-buffering Q, not dO).
template <>
struct DkdvTile<128, DkdvTileSize::kSmall> {
  static constexpr int kBlockN = 64, kBlockM = 64, kWarpsN = 4, kWarpsD = 2;
  static constexpr int kKeyTilesPerWarp = 1;
  static constexpr int kDqRowTilesPerWarp = 2;
  static constexpr int kQueryStages = 1;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};
// d256: warps 2 (keys, 32 each) x 4 (columns, 64 each; S^T queries, 16
// each) instead of 4 x 2 with 16 keys: 576 instead of 672 KB of shared
// memory read per step. Set to false for 4 x 2.
constexpr bool kDkdvD256TwoKeyTiles = true;
template <>
struct DkdvTile<256> {
  static constexpr int kBlockN = 64, kBlockM = 64;
  static constexpr int kWarpsN = kDkdvD256TwoKeyTiles ? 2 : 4;
  static constexpr int kWarpsD = kDkdvD256TwoKeyTiles ? 4 : 2;
  static constexpr int kKeyTilesPerWarp = kDkdvD256TwoKeyTiles ? 2 : 1;
  static constexpr int kDqRowTilesPerWarp = kFusedDqTwoRowTiles ? 2 : 1;
  static constexpr int kQueryStages = 2;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};
// d256 for devices below the default tile's 209 KB (sm80 allows 163 KB): the
// same shape single-buffered, K, V 64 KB + Q, dO 64 KB + P^T, dS^T 16 KB
// (145 KB). sm86 / sm89 (99 KB) take the next one.
template <>
struct DkdvTile<256, DkdvTileSize::kSmall> {
  static constexpr int kBlockN = DkdvTile<256>::kBlockN, kBlockM = DkdvTile<256>::kBlockM;
  static constexpr int kWarpsN = DkdvTile<256>::kWarpsN, kWarpsD = DkdvTile<256>::kWarpsD;
  static constexpr int kKeyTilesPerWarp = DkdvTile<256>::kKeyTilesPerWarp;
  static constexpr int kDqRowTilesPerWarp = DkdvTile<256>::kDqRowTilesPerWarp;
  static constexpr int kQueryStages = 1;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};

// d256 for sm86 / sm89 (99 KB per block): 32 keys x 64 queries on 2 x 4
// warps (one m16 key tile per warp; each warp 16 queries of S^T / dP^T and
// 64 columns of dK, dV), single-buffered, with V in registers: each warp
// reads its 16 keys of V once as the A operand of dP^T = V dO^T (64
// registers per thread), and P^T, dS^T then use V's 16 KB. K 16 KB + V /
// P^T, dS^T 16 KB + Q, dO 64 KB (96.5 KB); with V's own space it would be
// 104.5 KB. FlashAttention-2's sm86 d256 tile does the same (64 x 32, V in
// registers). The query tile stays 64 (the ordered dQ's counters count
// query tiles of the default's kBlockM; fewer than 64 queries would also
// make P^T / dS^T rows shorter than the 128 bytes the swizzled layout
// needs, smem_layout.hpp). Fused dQ only (kFusedDqOnly): the separate dQ
// kernel needs 128 KB at d256.
template <>
struct DkdvTile<256, DkdvTileSize::kSmaller> {
  static constexpr int kBlockN = 32, kBlockM = 64, kWarpsN = 2, kWarpsD = 4;
  static constexpr int kKeyTilesPerWarp = 1;
  static constexpr int kDqRowTilesPerWarp = 2;
  static constexpr int kQueryStages = 1;
  static constexpr bool kFusedDqOnly = true;
  static constexpr bool kVInRegisters = true;
};

// dQ, d64 and d128: 4 warps x 32 query rows (two m16 tiles) instead of 8 x
// 16, the forward's trade: each warp reads K (twice) and V once per step for
// its rows, so two m16 tiles per warp halve those shared-memory reads per
// FLOP (the 8-warp kernel ran at 76% of shared-memory wavefronts, 48%
// tensor pipe). d128 takes 32-key tiles to keep dQ 128 + S 32 + dP 32 f32
// registers per thread; d64 keeps 64-key tiles (64 + 64 + 64). Set to false
// for the previous 8 warps x 16 rows.
constexpr bool kDqTwoTilesPerWarp = true;
template <int kD>
struct DqTile;
template <>
struct DqTile<64> {
  static constexpr int kBlockM = 128, kBlockN = 64;
  static constexpr int kWarps = kDqTwoTilesPerWarp ? 4 : 8;
};
template <>
struct DqTile<128> {
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kDqTwoTilesPerWarp ? 32 : 64;
  static constexpr int kWarps = kDqTwoTilesPerWarp ? 4 : 8;
};
template <>
struct DqTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 32, kWarps = 4;
};

// The dQ strategies. kOrdered and kAtomic share one dK/dV kernel
// (backward_dkdv_kernel<..., kFusedDq = true>): kAtomic is kOrdered with a
// null counter pointer (a runtime test, no extra instantiation).
enum class DqStrategy { kSeparate, kOrdered, kAtomic };
// The deterministic strategy the backend uses when the environment does not
// choose (GQATTN_FLASH_DQ=ordered|separate|atomic, read by
// flash_backend.cpp). Never kAtomic: with Options::deterministic == false
// the backend picks kAtomic itself.
// - d64, d128: ordered, which measured at least as fast as separate on the
//   H200 (bwd TFLOP/s ordered vs separate, 2026-11-30: d128, eleventh
//   session: causal T1k 220 vs 213, non-causal T1k 260 vs 246, T4k 270 vs
//   261, T16k 280 vs 264; fifth session: causal T4k 255 vs 252, T16k 271
//   vs 265, w1024 221 vs 219; softcap 30 215 vs 197 on earlier kernels;
//   d64 on its 128-query tile, eleventh session: causal T4k 242 vs
//   228, T1k 198 vs 187, T16k 258 vs 241, non-causal 249 vs 234, w1024 209
//   vs 195, softcap 30 194 vs 163). Separate for d64 on the 64-query tile
//   (small_smem_dkdv_tile, or kDkdvD64QueryTile128 false), where it won,
//   220 vs 209. On the fragment-major accumulator (2026-12-01): d128
//   causal B4 T4k 285 vs 251, B16 T1k 230 vs 213, non-causal 293 vs 257;
//   d64 causal B4 T4k 255 vs 227, B16 T1k 204 vs 186.
// - d256: ordered from kOrderedDqD256MinKeysCausal keys (causal) or
//   kOrderedDqD256MinKeysNonCausal (not), separate below. Ordered's cost
//   there is its ordering (the release fence before each signal, timed in
//   docs/flash.md, "The ordered dQ's fence, timed"), which long problems
//   amortise. Measured on the fragment-major accumulator (2026-12-01, one
//   call, H16/8 unless noted, bwd TFLOP/s ordered / separate): causal B16
//   T1k 161 / 172, B8 T2k 205 / 188, B4 T4k 240 / 197 (separate from the
//   eleventh session); non-causal B16 T1k 176 / 186, B4 T4k 198 / 199, B1
//   T16k 246 / 205, B4 T4k H16/16 189 / 195. (On the row-major accumulator
//   before it, ordered won only causal problems from 4096 keys.)
// - On the small-shared-memory dK/dV tiles (measured on the H200 with the
//   tile forced, GQATTN_FLASH_DKDV_TILE=small, same call; bwd TFLOP/s
//   ordered / separate): d64's 64-query tile separate (causal B4 T4k 217 /
//   217, B16 T1k 172 / 180); d128's 64 x 64 tile ordered from
//   kOrderedDqSmallD128MinKeys keys (causal B4 T4k 190 / 181, non-causal
//   191 / 176, causal B16 T1k 134 / 154); d256's single-buffered tile
//   ordered from kOrderedDqSmallD256MinKeys keys, causal or not (causal B16
//   T1k 153 / 157, B8 T2k 198 / 174; non-causal B16 T1k 166 / 169, B4 T4k
//   230 / 184, B1 T16k 235 / 188, B4 T4k H16/16 176 / 182).
constexpr int kOrderedDqD256MinKeysCausal = 2048;
constexpr int kOrderedDqD256MinKeysNonCausal = 8192;
constexpr int kOrderedDqSmallD128MinKeys = 4096;
constexpr int kOrderedDqSmallD256MinKeys = 2048;
// - d256's kSmaller tile (sm86 / sm89) has no separate dQ: ordered.
constexpr DqStrategy default_dq_strategy(int d, bool causal, long long tk,
                                         DkdvTileSize tile = DkdvTileSize::kDefault) {
  const auto ordered_from = [tk](long long min_keys) {
    return tk >= min_keys ? DqStrategy::kOrdered : DqStrategy::kSeparate;
  };
  if (tile == DkdvTileSize::kSmaller) return DqStrategy::kOrdered;
  if (tile == DkdvTileSize::kSmall) {
    if (d == 128) return ordered_from(kOrderedDqSmallD128MinKeys);
    if (d == 256) return ordered_from(kOrderedDqSmallD256MinKeys);
    return DqStrategy::kSeparate;
  }
  if (d == 64 && !kDkdvD64QueryTile128) return DqStrategy::kSeparate;
  if (d == 256)
    return ordered_from(causal ? kOrderedDqD256MinKeysCausal : kOrderedDqD256MinKeysNonCausal);
  return DqStrategy::kOrdered;
}
static_assert(default_dq_strategy(64, true, 4096) != DqStrategy::kAtomic &&
                  default_dq_strategy(128, true, 4096) != DqStrategy::kAtomic &&
                  default_dq_strategy(256, true, 4096) != DqStrategy::kAtomic &&
                  default_dq_strategy(256, false, 1024) != DqStrategy::kAtomic,
              "the default must be deterministic");

// Fused (ordered or atomic) dQ: warps of the dK/dV kernel form a
// (kBlockM / (16 kDqRowTilesPerWarp)) x rest grid over the dQ partial; each
// warp adds at most kDqPassCols columns per pass (bounds its f32
// accumulator registers: 32 rows x 32 columns -> 32 per thread; at 64
// columns of 16 rows the d128 kernel spilled).
constexpr int kDqPassCols = 32;
// Postprocess (dq = accumulator * scale -> 16-bit): threads per block, 8
// elements (one 16-byte store) per thread.
constexpr int kDqPostThreads = 256;
constexpr int kDqPostElemsPerThread = 8;  // one 16-byte chunk

constexpr int kKeyStages = 2;  // dQ: K, V double-buffered

// Shared memory of each kernel, in bytes.
template <int kD>
constexpr std::size_t forward_smem_bytes() {
  using T = ForwardTile<kD>;
  return std::size_t(T::kBlockM + 2 * T::kBlockN) * kD * kElemBytes;
}
// Tiles of kBlockN x kBlockM 16-bit values the dK/dV kernel keeps in shared
// memory: P^T and dS^T when kWarpsD > 1; else dS^T alone for fused
// (ordered or atomic) dQ.
template <int kD, bool kFusedDq, DkdvTileSize kSize = DkdvTileSize::kDefault>
constexpr int dkdv_p_tiles() {
  return DkdvTile<kD, kSize>::kWarpsD > 1 ? 2 : (kFusedDq ? 1 : 0);
}
template <int kD, bool kFusedDq = false, DkdvTileSize kSize = DkdvTileSize::kDefault>
constexpr std::size_t dkdv_smem_bytes() {
  using T = DkdvTile<kD, kSize>;
  const std::size_t kv = std::size_t(2) * T::kBlockN * kD * kElemBytes;
  const std::size_t q_do = std::size_t(T::kQueryStages) * 2 * T::kBlockM * kD * kElemBytes;
  // With V in registers P^T and dS^T take V's space.
  const std::size_t p_ds = T::kVInRegisters ? 0
                                            : std::size_t(dkdv_p_tiles<kD, kFusedDq, kSize>()) *
                                                  T::kBlockN * T::kBlockM * kElemBytes;
  const std::size_t rows = std::size_t(T::kQueryStages) * 2 * T::kBlockM * sizeof(float);
  return kv + q_do + p_ds + rows;
}
// The dK/dV kernels of a tile that run (separate and fused dQ; fused only
// for a kFusedDqOnly tile).
template <int kD, DkdvTileSize kSize = DkdvTileSize::kDefault>
constexpr std::size_t dkdv_max_smem_bytes() {
  const std::size_t fused = dkdv_smem_bytes<kD, true, kSize>();
  if constexpr (DkdvTile<kD, kSize>::kFusedDqOnly) return fused;
  return std::max(dkdv_smem_bytes<kD, false, kSize>(), fused);
}
template <int kD>
constexpr std::size_t dq_smem_bytes() {
  using T = DqTile<kD>;
  return std::size_t(2) * T::kBlockM * kD * kElemBytes +
         std::size_t(kKeyStages) * 2 * T::kBlockN * kD * kElemBytes;
}

// The smallest dK/dV tile head dimension d has; d has every size up to it.
constexpr DkdvTileSize smallest_dkdv_tile(int d) {
  if (d == 256) return DkdvTileSize::kSmaller;
  if (d == 128 || (d == 64 && kDkdvD64QueryTile128)) return DkdvTileSize::kSmall;
  return DkdvTileSize::kDefault;
}
// The size that runs when `wanted` is asked for: wanted, or d's smallest
// where d has no tile that small.
constexpr DkdvTileSize clamp_dkdv_tile(int d, DkdvTileSize wanted) {
  return int(wanted) <= int(smallest_dkdv_tile(d)) ? wanted : smallest_dkdv_tile(d);
}
// What the host needs of one dK/dV tile, at run time.
struct DkdvTileInfo {
  std::size_t max_smem_bytes;  // dkdv_max_smem_bytes
  int key_tile;                // kBlockN: the dK/dV grid's unit
  bool fused_dq_only;          // kFusedDqOnly
};
template <int kD, DkdvTileSize kSize>
constexpr DkdvTileInfo dkdv_tile_info() {
  using T = DkdvTile<kD, kSize>;
  return {dkdv_max_smem_bytes<kD, kSize>(), T::kBlockN, T::kFusedDqOnly};
}
// d (64, 128, 256) and a size, clamped to the sizes d has.
constexpr DkdvTileInfo dkdv_tile_info(int d, DkdvTileSize size) {
  using S = DkdvTileSize;
  size = clamp_dkdv_tile(d, size);
  switch (d) {
    case 64:
      return size == S::kDefault ? dkdv_tile_info<64, S::kDefault>()
                                 : dkdv_tile_info<64, S::kSmall>();
    case 128:
      return size == S::kDefault ? dkdv_tile_info<128, S::kDefault>()
                                 : dkdv_tile_info<128, S::kSmall>();
    default:
      return size == S::kDefault ? dkdv_tile_info<256, S::kDefault>()
             : size == S::kSmall ? dkdv_tile_info<256, S::kSmall>()
                                 : dkdv_tile_info<256, S::kSmaller>();
  }
}
constexpr std::size_t dkdv_max_smem_bytes(int d, DkdvTileSize size) {
  return dkdv_tile_info(d, size).max_smem_bytes;
}
constexpr int dkdv_key_tile(int d, DkdvTileSize size) { return dkdv_tile_info(d, size).key_tile; }
constexpr bool dkdv_fused_dq_only(int d, DkdvTileSize size) {
  return dkdv_tile_info(d, size).fused_dq_only;
}
// The dK/dV tile the backward runs at d on a device that allows optin_smem
// bytes per block: the largest of d's tiles that fits (d's smallest when
// none does; the backend's support check refuses that device).
constexpr DkdvTileSize dkdv_tile_for_device(int d, std::size_t optin_smem) {
  for (DkdvTileSize size : {DkdvTileSize::kDefault, DkdvTileSize::kSmall})
    if (clamp_dkdv_tile(d, size) == size && dkdv_max_smem_bytes(d, size) <= optin_smem) return size;
  return smallest_dkdv_tile(d);
}
// The shared memory per block cuda-flash's backward needs at head
// dimension kD: its smallest dK/dV tile's kernels, and the separate dQ
// kernel unless that tile runs without it.
template <int kD>
constexpr std::size_t backward_min_smem_bytes() {
  constexpr DkdvTileSize kSmallest = smallest_dkdv_tile(kD);
  const std::size_t dkdv = dkdv_max_smem_bytes<kD, kSmallest>();
  if constexpr (DkdvTile<kD, kSmallest>::kFusedDqOnly) return dkdv;
  return std::max(dkdv, dq_smem_bytes<kD>());
}

}  // namespace gqattn::flash
