// cuda-hopper: the forward's tile shapes per head dimension, its thread
// layout and register split, and the shared memory one CTA needs (the
// backend's why_not compares it with the device's opt-in limit). Plain C++
// so the host side can use it; the kernel static_asserts what it relies on.
// Checked by compiling, by tests/cpu/test_hopper_tile_choice.cpp and by
// tests/gpu/test_hopper_forward.cpp (d 64, 128, 256; the wide d128 tile by
// its non-causal d128 cases, the tall d64 tile by its d64 cases with Tk >=
// kTallD64MinKeys).
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
// softcap or window.
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

// The tile shapes a head dimension may have besides its default.
enum class TileShape { kDefault, kWide, kTall };

// ForwardTile<kD, kShape>: kD the head dimension; kShape the default, the
// wide key tile (<128, kWide>) or the tall tile (<64, kTall>), used as
// forward_shape() says. Its traits, each with the record that decided it:
// kKvGroupPairs: (batch, kv head) pairs per group of the kv-grouped tile
//   order (tile_order.hpp) for problems with neither mask; 0: longest first
//   always (docs/decisions/hopper-forward-kv-grouped-order.md).
// kLazyRescaleLog2: the softmax skips O's rescale while no row's maximum
//   grew by more than 2^this (docs/decisions/hopper-forward-lazy-rescale.md).
// kQInRegistersAllowed: S = Q K^T may take Q from registers, where the
//   consumer has d / 4 registers to spare
//   (docs/decisions/hopper-forward-q-in-registers.md).
// kFmaExp2QuartersPlain / kFmaExp2QuartersSoftcap: of every four n8 blocks
//   of P, how many take their exponentials on the FMA pipe (fused::exp2_fma)
//   instead of the MUFU; 0: all on the MUFU
//   (docs/decisions/hopper-forward-exp2-on-mufu.md).
// kPingPongAllowed: the consumer warpgroups take turns issuing their GEMMs
//   (docs/decisions/hopper-forward-overlap-and-ping-pong.md).
// kMulticastAllowed: the tile may take K/V multicast over a 2-CTA cluster
//   (docs/decisions/hopper-forward-multicast-kv.md).
// kFastSoftcapAllowed / kTwoMufuSoftcapExponents: softcap's tanh with one
//   MUFU op; the no-row-max exponents in the two-MUFU form
//   (docs/decisions/hopper-forward-one-mufu-softcap.md).
// kSoftcapPolyAllowed: the polynomial tanh on tiles of small logits
//   (docs/decisions/hopper-forward-softcap-poly.md).
// kStageOutputAllowed: the tile has shared memory left for O's staging
//   area (kBlockM x d) and stores O by TMA; the others pass O through
//   per-warp chunks (docs/decisions/hopper-forward-output-stores.md).
template <int kD, TileShape kShape = TileShape::kDefault>
struct ForwardTile;
template <>
struct ForwardTile<64> {
  static constexpr int kD = 64, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr int kKvGroupPairs = 0;  // 8 measured 1-2% slower
  static constexpr int kLazyRescaleLog2 = 0;
  static constexpr bool kQInRegistersAllowed = true;
  static constexpr int kFmaExp2QuartersPlain = 0, kFmaExp2QuartersSoftcap = 0;
  static constexpr bool kPingPongAllowed = true;
  static constexpr bool kMulticastAllowed = false;  // one column block: nothing to split
  static constexpr bool kFastSoftcapAllowed = true;
  static constexpr bool kTwoMufuSoftcapExponents = false;  // MUFU-bound: one MUFU op per score
  static constexpr bool kSoftcapPolyAllowed = true;
  static constexpr bool kStageOutputAllowed = true;
};
// A wide or tall tile is its head dimension's default with more key or
// query rows (and what that costs in registers): every other property is
// the default's.
// 192 x 128, three consumer warpgroups at 160 registers: R0-R157 (ptxas
// 13.0), no room for Q; measured faster without ping-pong
// (docs/decisions/hopper-forward-tall-d64-tile.md).
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
// registers, O 64; at 220 of 240 registers no room for Q
// (docs/decisions/hopper-forward-wide-d128-tile.md).
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
  static constexpr bool kMulticastAllowed = false;  // measured slower
  // The one-MUFU tanh spills 9 registers (ptxas 13.0), and d256's softmax
  // (half d128's elements per GEMM FLOP) is not MUFU-bound.
  static constexpr bool kFastSoftcapAllowed = false;
  static constexpr bool kTwoMufuSoftcapExponents = true;
  static constexpr bool kSoftcapPolyAllowed = false;  // measured slower: not MUFU-bound
  static constexpr bool kStageOutputAllowed = false;
};

// Whether head dimension d has a tile of `shape` for softcap on or off at
// all: which kernels the launchers instantiate. Neither the wide nor the
// tall tile runs softcap: the MUFU-bound softmax gains nothing from a
// longer tile (docs/decisions/hopper-forward-wide-d128-tile.md), and the
// tall tile's 160-register consumers spill under it
// (docs/decisions/hopper-forward-tall-d64-tile.md).
constexpr bool has_tile(int d, TileShape shape, bool softcap) {
  switch (shape) {
    case TileShape::kWide: return d == 128 && !softcap;
    case TileShape::kTall: return d == 64 && !softcap;
    default: return true;
  }
}
// d64 problems take the tall tile from this many keys on: below it the
// diagonal and the last query tile waste more of its 192 rows than its
// third warpgroup gains (docs/decisions/hopper-forward-tall-d64-tile.md).
constexpr int kTallD64MinKeys = 1024;
// The tile a problem runs on. causal, window (0: none), tq and tk are
// MaskArgs', softcap ScoreArgs', so the host (TMA box rows, shared memory,
// query tiles) and the launcher (kernel instance) decide alike. The wide
// d128 tile takes problems with neither mask, the tall d64 tile long ones
// without window; tq takes no part (no Tq threshold has been measured).
constexpr TileShape forward_shape(int d, bool causal, int window, int /*tq*/, int tk,
                                  bool softcap) {
  if (window != 0) return TileShape::kDefault;
  if (has_tile(d, TileShape::kTall, softcap) && tk >= kTallD64MinKeys) return TileShape::kTall;
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
// off: not under softcap, whose consumers have no d / 4 registers to spare
// (docs/decisions/hopper-forward-q-in-registers.md).
template <class Tile>
constexpr bool q_in_registers(bool softcap) {
  return Tile::kQInRegistersAllowed && !softcap;
}

// CTAs per cluster when K/V are multicast, and whether a tile under softcap
// on or off is: the tile allows it, no softcap (measured slower), and its
// column blocks split evenly between the cluster's CTAs
// (docs/decisions/hopper-forward-multicast-kv.md).
constexpr int kMulticastCtas = 2;
template <class Tile, bool kSoftcap>
constexpr bool multicast_tile() {
  return Tile::kMulticastAllowed && !kSoftcap && (Tile::kD / kColBlock) % kMulticastCtas == 0;
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

// Whether the epilogue of `Tile` stages O for a TMA store; the other tiles
// reserve per-warp chunks of O instead, 16 rows x 32 columns of 16-bit
// elements per warp (docs/decisions/hopper-forward-output-stores.md).
template <class Tile>
constexpr bool stages_output() {
  return Tile::kStageOutputAllowed;
}
constexpr int kOutChunkRows = 16;  // a warp's rows of the wgmma accumulator
constexpr int kOutChunkCols = 32;  // 64 bytes per row: two full 32-byte sectors
constexpr uint32_t kOutChunkBytes = uint32_t(kOutChunkRows) * kOutChunkCols * kElemBytes;

// Byte offsets of one CTA's shared memory, from a 1024-byte aligned base:
// Q, then kStages K slots, then kStages V slots (each slot a whole tile, so
// every tile starts on a swizzle-atom boundary), then the mbarriers, then
// (atom-aligned) a tile of ones, then O's staging area: where
// stages_output() per consumer warpgroup a K-major [64 x d] tile, elsewhere
// per consumer warp one chunk (kOutChunkBytes).
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
  // ScoreMode::softcap_without_row_max (consumer_mainloop.cuh); unused otherwise.
  static constexpr uint32_t kOnesBytes = 2 * kSwizzleAtomBytes;
  static constexpr uint32_t kOnes =
      (kQEmpty + kBarrierBytes + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr uint32_t kOutWarpgroupBytes = uint32_t(kWgmmaM) * kD * kElemBytes;
  static constexpr uint32_t kOut = kOnes + kOnesBytes;
  static constexpr uint32_t kOutBytes =
      stages_output<Tile>()
          ? uint32_t(consumer_warpgroups<Tile>()) * kOutWarpgroupBytes
          : uint32_t(consumer_warpgroups<Tile>()) * kWarpsPerWarpgroup * kOutChunkBytes;
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
