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
// registers; each departure from the earlier shape has a decision record in
// docs/decisions/, named at the tile):
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
// - dQ, three strategies (DqStrategy, chosen per call by the plan, see
//   plan.cpp; the first two deterministic):
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
};
// d128: 4 warps x 32 rows (two m16 tiles), so each K/V fragment read from
// shared memory feeds two mma: docs/decisions/flash-forward-d128-two-tiles-per-warp.md.
template <>
struct ForwardTile<128> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4;
};
template <>
struct ForwardTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4;
};

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
// dS^T use V's shared memory. kDqRowTilesPerWarp: m16 tiles of queries per
// warp in the fused dQ partial dS K (two where each K fragment may feed two
// mma: docs/decisions/flash-fused-dq-two-row-tiles.md).
enum class DkdvTileSize { kDefault, kSmall, kSmaller };
template <int kD, DkdvTileSize kSize = DkdvTileSize::kDefault>
struct DkdvTile;
// d64 for devices below the default tile's 162 KB per block (sm86 and sm89
// allow 99 KB): 64-query tiles on 8 x 1 warps with P^T, dS^T in registers
// (81 KB).
template <>
struct DkdvTile<64, DkdvTileSize::kSmall> {
  static constexpr int kBlockN = 128, kBlockM = 64, kWarpsN = 8, kWarpsD = 1;
  static constexpr int kKeyTilesPerWarp = 1;
  static constexpr int kDqRowTilesPerWarp = 1;
  static constexpr int kQueryStages = 2;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};
// d64: query tiles of 128 on warps 4 (keys, 32 each) x 2 (dK/dV columns,
// 32 each; S^T / dP^T queries, 64 each), FlashAttention-2's d64 shape: half
// the steps per key tile of the 64-query tile above, which runs where this
// one's 162 KB do not fit: docs/decisions/flash-dkdv-d64-query-tile-128.md.
template <>
struct DkdvTile<64> {
  static constexpr int kBlockN = 128, kBlockM = 128, kWarpsN = 4, kWarpsD = 2;
  static constexpr int kKeyTilesPerWarp = 2;
  static constexpr int kDqRowTilesPerWarp = 2;
  static constexpr int kQueryStages = 2;
  static constexpr bool kFusedDqOnly = false;
  static constexpr bool kVInRegisters = false;
};
// d128: warps 4 (keys, 32 each: two m16 tiles) x 2 (dK/dV columns, 64
// each; S^T / dP^T queries, 32 each), P^T and dS^T through shared memory:
// less shared memory read per step than 8 x 1 with P^T, dS^T in registers
// (docs/decisions/flash-dkdv-warp-grids.md).
template <>
struct DkdvTile<128> {
  static constexpr int kBlockN = 128, kBlockM = 64, kWarpsN = 4, kWarpsD = 2;
  static constexpr int kKeyTilesPerWarp = 2;
  static constexpr int kDqRowTilesPerWarp = 2;
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
// each): less shared memory read per step than 4 x 2 with 16 keys
// (docs/decisions/flash-dkdv-warp-grids.md).
template <>
struct DkdvTile<256> {
  static constexpr int kBlockN = 64, kBlockM = 64, kWarpsN = 2, kWarpsD = 4;
  static constexpr int kKeyTilesPerWarp = 2;
  static constexpr int kDqRowTilesPerWarp = 2;
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

// dQ, d64 and d128: 4 warps x 32 query rows (two m16 tiles), which halves
// the shared-memory reads of K and V per FLOP; d128 on 32-key tiles to keep
// dQ 128 + S 32 + dP 32 f32 registers per thread
// (docs/decisions/flash-dq-two-tiles-per-warp.md).
template <int kD>
struct DqTile;
template <>
struct DqTile<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4;
};
template <>
struct DqTile<128> {
  static constexpr int kBlockM = 128, kBlockN = 32, kWarps = 4;
};
template <>
struct DqTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 32, kWarps = 4;
};

// The dQ strategies. kOrdered and kAtomic share one dK/dV kernel
// (backward_dkdv_kernel<..., kFusedDq = true>): kAtomic is kOrdered with a
// null counter pointer (a runtime test, no extra instantiation).
enum class DqStrategy { kSeparate, kOrdered, kAtomic };
// The deterministic strategy a plan takes unless the caller overrides it
// (plan.cpp). Never kAtomic: with Options::deterministic == false the plan
// picks kAtomic itself.
// The measurements behind each rule: docs/decisions/flash-default-dq-strategy.md.
// - d64, d128: ordered, at least as fast as separate on the H200.
// - d256: ordered from kOrderedDqD256MinKeysCausal keys (causal) or
//   kOrderedDqD256MinKeysNonCausal (not), separate below: ordered's cost
//   there is its ordering (the release fence before each signal), which
//   long problems amortise.
// - The small-shared-memory dK/dV tiles: d64's 64-query tile separate;
//   d128's 64 x 64 tile ordered from kOrderedDqSmallD128MinKeys keys;
//   d256's single-buffered tile ordered from kOrderedDqSmallD256MinKeys
//   keys, causal or not.
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
  if (d == 128 || d == 64) return DkdvTileSize::kSmall;
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
