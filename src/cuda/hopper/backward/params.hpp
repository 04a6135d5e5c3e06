// cuda-hopper: the backward's kernel parameters, tile shapes, shared-memory
// layouts, grid sizes and launcher declarations (plain C++: the host side,
// hopper_backend.cpp, uses them; the kernels static_assert what they rely
// on). Checked by compiling and by tests/gpu/test_hopper_backward.cpp.
//
// Three kernels run in order on the caller's stream
// (docs/backends/cuda-hopper.md, "Backward"): the fused layer's preprocessing kernel (lse2 = lse *
// log2 e and D = rowsum(dO o O) into a [B*H, tq_padded] f32 workspace), the dK/dV kernel (one CTA
// per key tile, kv head, batch, walking the query tiles of every query head of the GQA group) and
// the dQ kernel (one CTA per query tile, head, batch, walking the key tiles and recomputing S and
// dP). No atomics anywhere: every output element is written once, by one thread, after a
// fixed-order reduction, so the gradients are bitwise reproducible.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "cuda/fused/params.hpp"
#include "cuda/hopper/backward/tile_sizes.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"

namespace gqattn::hopper::bwd {

using fused::ElemType;

// Every TMA box of the backward is 64 columns x 1 head x kBoxRows rows x 1
// batch; taller tiles are loaded as several boxes (a box at a multiple of
// 1024 bytes lands with the same 128-byte swizzle phase as the rows of one
// tall box would).
constexpr int kBoxRows = 64;
// K and V are loaded in boxes of kv_box_rows(d) rows: the d = 256 dQ
// kernel's key tiles are shorter than kBoxRows.
constexpr int kv_box_rows(int64_t d) {
  return d == 256 && DqTile<256>::kBlockN < kBoxRows ? DqTile<256>::kBlockN : kBoxRows;
}

struct BackwardParams {
  // Maps of q, do [B, Tq, H, d] and k, v [B, Tk, Hkv, d] (tma_desc.hpp),
  // boxes of kBoxRows rows (k, v: kv_box_rows(d)).
  CUtensorMap q_map;
  CUtensorMap k_map;
  CUtensorMap v_map;
  CUtensorMap do_map;
  // Maps of dq [B, Tq, H, d] and dk, dv [B, Tk, Hkv, d], boxes of 64 rows:
  // the gradients go out by TMA when grads_by_tma (all three meet TMA's
  // alignment), else by plain stores through c's
  // pointers and strides.
  CUtensorMap dq_map;
  CUtensorMap dk_map;
  CUtensorMap dv_map;
  bool grads_by_tma = false;
  // Pointers, strides, shape, mask, score and the workspace (lse2, dsum,
  // tq_padded): cuda-flash's parameters, also what its preprocessing kernel
  // reads.
  fused::BackwardParams c;
  // Fused dQ (chosen when dq_accum is set; DkdvTile::kFusedDqSupported):
  // the f32 accumulator (not zeroed: the first key tile of a query tile
  // stores), one block of kBlockM x d floats per (b, h, query tile), in the
  // order dq_accum_index() gives; and one semaphore per block (zeroed before
  // the dK/dV kernel; it counts the key tiles that have added), which fixes
  // the order of the adds.
  float* dq_accum = nullptr;
  int* dq_semaphores = nullptr;
  // What dK and dQ are multiplied by at the end: the softmax scale, times 4
  // under softcap, where the kernels form dS / 4 (backward_common.cuh,
  // p_and_ds_factor). Set with c.lse2_shift by softcap_backward_terms().
  float dkdq_scale = 0.0f;
  // (batch, kv head) pairs per group of the dK/dV grid (dkdv_group_pairs,
  // backward_tile_sizes.hpp); 0: key-tile major.
  int dkdv_group_pairs = 0;
};

// The softcap-dependent terms of `p` from p.c.score: under softcap the
// workspace holds lse2 - mult and dS / 4 is formed (p_and_ds_factor), so
// dK and dQ are scaled by 4 x scale; otherwise lse2 and dS as they are.
inline void softcap_backward_terms(BackwardParams& p) {
  constexpr float kDsQuarter = 4.0f;  // dS = 4 x what p_and_ds_factor forms
  p.c.lse2_shift = p.c.score.softcap ? p.c.score.mult : 0.0f;
  p.dkdq_scale = p.c.score.softcap ? kDsQuarter * p.c.score.scale : p.c.score.scale;
}

// Thread layout of both kernels: warpgroup 0 is the producer (one thread
// issues every copy), warpgroups 1 and 2 the consumers, each owning the 64
// rows of one wgmma M. Register split as FlashAttention-3's backward with 2
// consumer warpgroups: 128 x 24 + 256 x 240 = 64512 <= 65536.
constexpr int kBwdConsumerWarpgroups = 2;
constexpr int kBwdThreads = (1 + kBwdConsumerWarpgroups) * kWarpgroupThreads;  // 384
constexpr int kBwdConsumerWarps = kBwdConsumerWarpgroups * kWarpsPerWarpgroup;
constexpr int kBwdProducerRegisters = 24;
constexpr int kBwdConsumerRegisters = 240;
static_assert(kWarpgroupThreads * kBwdProducerRegisters +
                      kBwdConsumerWarpgroups * kWarpgroupThreads * kBwdConsumerRegisters <=
                  65536,
              "register split exceeds the register file");

// Head dimensions with a backward here (at d = 256 the two consumer
// warpgroups share each tile: backward_tile_sizes.hpp, split_d).
constexpr bool head_dim_supported(int64_t d) { return d == 64 || d == 128 || d == 256; }

// Byte offsets from a 1024-byte aligned base; every tile is d/64 column
// blocks of [rows][64] elements and starts on a 1024-byte boundary.
template <int kD, bool kFusedDq = false>
struct DkdvSmem {
  using Tile = DkdvTile<kD>;
  static_assert(!kFusedDq || Tile::kFusedDqSupported, "no fused dQ for this head dimension");
  static constexpr uint32_t kKVBytes = uint32_t(Tile::kBlockN) * kD * kElemBytes;
  static constexpr uint32_t kQBytes = uint32_t(Tile::kBlockM) * kD * kElemBytes;  // Q or dO
  static constexpr uint32_t kRowBytes = uint32_t(Tile::kBlockM) * sizeof(float);  // lse2 or D
  static constexpr uint32_t kK = 0;
  static constexpr uint32_t kV = kK + kKVBytes;
  static constexpr uint32_t kQ = kV + kKVBytes;  // stage s: kQ + s * kQBytes
  static constexpr uint32_t kDo = kQ + Tile::kStages * kQBytes;
  // Fused dQ only (else 0 bytes): two dS buffers of [kBlockN keys][kBlockM
  // queries] (alternating steps: one warpgroup may still read step t's while
  // the other writes step t + 1's) and the f32 staging of one step's partial
  // for the bulk reduce-add; by turns one staging buffer per consumer
  // warpgroup (buffer t % 2, read by writer t % kDqWriters), so that a
  // warpgroup never waits for the read of the other's partial, and no two
  // threads write the same staging address.
  static constexpr uint32_t kDsBytes =
      kFusedDq ? uint32_t(Tile::kBlockN) * Tile::kBlockM * kElemBytes : 0u;
  static constexpr uint32_t kDqStageBytes =
      kFusedDq ? uint32_t(Tile::kBlockM) * kD * sizeof(float) : 0u;
  static constexpr int kDqStageBuffers = Tile::kDqByTurns ? kBwdConsumerWarpgroups : 1;
  static_assert(!Tile::kDqByTurns || kDqWriters == kDqStageBuffers,
                "by turns: writer b reads staging buffer b");
  static constexpr uint32_t kDs = kDo + Tile::kStages * kQBytes;  // buffer i: + i kDsBytes
  static constexpr uint32_t kDqStage = kDs + 2 * kDsBytes;        // buffer b: + b kDqStageBytes
  // Split by gradient (d256): warpgroup 0's hand-over of P^T to warpgroup
  // 1 (dkdv_split_grad.cuh), two buffers (alternate steps).
  static constexpr uint32_t kXchgBytes =
      Tile::kSplitGradients ? uint32_t(kWarpgroupThreads) * Tile::kBlockM / 2 * sizeof(float) : 0u;
  static constexpr uint32_t kXchg =
      kDqStage + kDqStageBuffers * kDqStageBytes;            // warpgroup w: + w kXchgBytes
  static constexpr uint32_t kLse2 = kXchg + 2 * kXchgBytes;  // stage s: + s * kRowBytes
  static constexpr uint32_t kDsum = kLse2 + Tile::kStages * kRowBytes;
  static constexpr uint32_t kBarriers = kDsum + Tile::kStages * kRowBytes;
  static constexpr uint32_t kBarrierBytes = 8;
  // kv_full, then per stage full (Q, dO, lse2, D landed) and empty
  // (released), then per dQ writer dq_full (the consumers staged a partial
  // of one of its steps) and per staging buffer dq_empty (a writer has read
  // it).
  static constexpr uint32_t kKVFull = kBarriers;
  static constexpr uint32_t kFull = kKVFull + kBarrierBytes;
  static constexpr uint32_t kEmpty = kFull + Tile::kStages * kBarrierBytes;
  static constexpr uint32_t kDqFull = kEmpty + Tile::kStages * kBarrierBytes;  // writer i: + i
  static constexpr uint32_t kDqEmpty = kDqFull + kDqWriters * kBarrierBytes;   // buffer b: + b
  static constexpr uint32_t kEnd = kDqEmpty + kDqStageBuffers * kBarrierBytes;
  static constexpr std::size_t kAllocBytes = std::size_t(kEnd) + kSwizzleAtomBytes;
  // Bytes the producer announces on a stage's full barrier.
  static constexpr uint32_t kStageTxBytes = 2 * kQBytes + 2 * kRowBytes;
  // The gradients' staging at the end of the CTA (backward_epilogue.cuh):
  // per consumer warpgroup its dK tile, then its dV tile, [64 x kColsPerWg]
  // each, over the Q and dO slots, which no wgmma reads any more by then.
  static constexpr uint32_t kGradTileBytes = uint32_t(kWgmmaM) * Tile::kColsPerWg * kElemBytes;
  static constexpr uint32_t kGradStaging = kQ;
  static_assert(kDo == kQ + Tile::kStages * kQBytes &&
                    kBwdConsumerWarpgroups * 2 * kGradTileBytes <= 2 * Tile::kStages * kQBytes,
                "the gradients' staging must fit in the Q and dO slots");

  static_assert(kKVBytes % kSwizzleAtomBytes == 0 && kQBytes % kSwizzleAtomBytes == 0,
                "tiles must start on 1024-byte boundaries");
  static_assert(kRowBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  static_assert(kD % kColBlock == 0, "head dimension must be a multiple of 64");
  static_assert(kAllocBytes <= kBwdMaxSmemBytes, "dK/dV tiles exceed shared memory");
  static_assert(kDsBytes % kSwizzleAtomBytes == 0, "dS buffers start on 1024-byte boundaries");
};

// Fused dQ: the accumulator's block of (b, h, query tile m) starts at float
// dq_accum_block(...) * kBlockM * d; inside it, warpgroup w's columns form a
// contiguous part, and within that the float4 of thread i (0..127) holding
// the n8 block c of its wgmma accumulator is at float4 index c * 128 + i,
// so that the staging stores of a warp are contiguous (conflict-free) and
// one bulk reduce-add moves the whole block.
constexpr int64_t dq_accum_block(int64_t b, int64_t h, int64_t m, int64_t H, int64_t tq_padded,
                                 int64_t block_m) {
  return (b * H + h) * (tq_padded / block_m) + m;
}

template <int kD>
struct DqSmem {
  using Tile = DqTile<kD>;
  static constexpr uint32_t kQBytes = uint32_t(Tile::kBlockM) * kD * kElemBytes;   // Q or dO
  static constexpr uint32_t kKVBytes = uint32_t(Tile::kBlockN) * kD * kElemBytes;  // one slot
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kDo = kQ + kQBytes;
  static constexpr uint32_t kK = kDo + kQBytes;  // slot s: kK + s * kKVBytes
  static constexpr uint32_t kV = kK + Tile::kStages * kKVBytes;
  static constexpr uint32_t kBarriers = kV + Tile::kStages * kKVBytes;
  static constexpr uint32_t kBarrierBytes = 8;
  // q_full (Q and dO landed), then per slot full (K and V landed) and empty.
  static constexpr uint32_t kQFull = kBarriers;
  static constexpr uint32_t kFull = kQFull + kBarrierBytes;
  static constexpr uint32_t kEmpty = kFull + Tile::kStages * kBarrierBytes;
  static constexpr uint32_t kEnd = kEmpty + Tile::kStages * kBarrierBytes;
  static constexpr std::size_t kAllocBytes = std::size_t(kEnd) + kSwizzleAtomBytes;
  // The dQ staging at the end of the CTA (backward_epilogue.cuh): per
  // consumer warpgroup a [64 x kColsPerWg] tile, over the K and V slots,
  // which no wgmma reads any more by then.
  static constexpr uint32_t kGradTileBytes = uint32_t(kWgmmaM) * Tile::kColsPerWg * kElemBytes;
  static constexpr uint32_t kGradStaging = kK;
  static_assert(kV == kK + Tile::kStages * kKVBytes &&
                    kBwdConsumerWarpgroups * kGradTileBytes <= 2 * Tile::kStages * kKVBytes,
                "the dQ staging must fit in the K and V slots");

  static_assert(kKVBytes % kSwizzleAtomBytes == 0 && kQBytes % kSwizzleAtomBytes == 0,
                "tiles must start on 1024-byte boundaries");
  static_assert(kD % kColBlock == 0, "head dimension must be a multiple of 64");
  static_assert(kAllocBytes <= kBwdMaxSmemBytes, "dQ tiles exceed shared memory");
};

template <int kD>
constexpr std::size_t backward_smem_bytes() {
  constexpr std::size_t dkdv = DkdvSmem<kD, DkdvTile<kD>::kFusedDqSupported>::kAllocBytes;
  return dkdv > DqSmem<kD>::kAllocBytes ? dkdv : DqSmem<kD>::kAllocBytes;
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Thread blocks of each launch for head dimension d (64, 128 or 256).
constexpr int64_t dkdv_blocks(int64_t B, int64_t Hkv, int64_t Tk, int64_t d) {
  return ceil_div(Tk, split_d(int(d)) ? DkdvTile<256>::kBlockN : DkdvTile<128>::kBlockN) * B * Hkv;
}
constexpr int64_t dq_blocks(int64_t B, int64_t H, int64_t Tq, int64_t d) {
  const int block_m = d == 256   ? DqTile<256>::kBlockM
                      : d == 128 ? DqTile<128>::kBlockM
                                 : DqTile<64>::kBlockM;
  return ceil_div(Tq, block_m) * B * H;
}
static_assert(DkdvTile<64>::kBlockN == DkdvTile<128>::kBlockN &&
                  DqTile<64>::kBlockM == DqTile<128>::kBlockM,
              "grid sizes assume one tile shape for d 64 and 128");

// Fused dQ workspace: the f32 accumulator and the semaphores of the
// ordered adds (one per query tile of every head).
constexpr std::size_t fused_dq_accum_floats(int64_t B, int64_t H, int64_t tq_padded, int64_t d) {
  return std::size_t(B * H * tq_padded * d);
}
constexpr std::size_t fused_dq_semaphores(int64_t B, int64_t H, int64_t tq_padded) {
  return std::size_t(B * H * (tq_padded / DkdvTile<128>::kBlockM));
}
static_assert(DkdvTile<64>::kBlockM == DkdvTile<128>::kBlockM, "one query tile for d 64, 128");
// A varlen batch's: its workspace rows per head are head_rows
// (fused::varlen_workspace_rows), whole query tiles.
constexpr std::size_t fused_dq_varlen_semaphores(int64_t H, int64_t head_rows) {
  return std::size_t(H * (head_rows / DkdvTile<128>::kBlockM));
}

// The fused dQ's conversion kernel: one CTA per accumulator block (b, h,
// query tile).
constexpr int kDqConvertThreads = 256;
constexpr int64_t dq_convert_blocks(int64_t B, int64_t H, int64_t tq_padded) {
  return B * H * (tq_padded / DkdvTile<128>::kBlockM);
}

// Shared memory of the larger of the two kernels for head dimension d.
constexpr std::size_t backward_smem_bytes(int64_t d) {
  return d == 64    ? backward_smem_bytes<64>()
         : d == 128 ? backward_smem_bytes<128>()
                    : backward_smem_bytes<256>();
}

}  // namespace gqattn::hopper::bwd
