// cuda-hopper: the producer of the forward's pipeline: one thread of the
// producer warpgroup issues every TMA copy — Q once, then K and V of each
// visited key tile into a ring of kStages slots. Checked through
// tests/gpu/test_hopper_forward.cpp (a broken handshake deadlocks or reads
// a half-written tile there).
//
// Handshake per slot s (barriers of SmemLayout): the producer waits
// k_empty[s] (the consumers released the slot's previous tile; parity starts
// at 1 so the first pass through the ring does not wait), arms k_full[s]
// with the tile's byte count and issues the copies, whose completion flips
// k_full[s]; the same for V. Iteration `it` uses slot it % kStages in phase
// (it / kStages) & 1, exactly as the consumers count. Q has one slot with
// q_full / q_empty (the persistent scheduler's tiles reuse it).
// In a cluster of kCluster CTAs (K/V multicast, tile_sizes.hpp) each CTA's
// producer copies its share of every K/V tile's column blocks into all the
// cluster's CTAs; a slot's empty barrier then counts the consumer warps of
// every CTA (the copy writes into all of them) and its full barrier still
// expects the whole tile, half of which arrives from the other CTA.
#pragma once

#include <cstdint>

#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/forward/tile_schedule.cuh"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/ptx/cluster.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/tma.cuh"

namespace gqattn::hopper {

// Copies the [rows x kD] tile at (row0, head, batch) of `map` into the
// column blocks at `dst` (each [rows][64], rows * 128 bytes apart).
template <int kD, int kRows>
__device__ __forceinline__ void load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                          int row0, int head, int batch) {
  constexpr uint32_t kBlockBytes = uint32_t(kRows) * kSwizzleBytes;
#pragma unroll
  for (int c = 0; c < kD / kColBlock; ++c)
    ptx::tma_load_4d(dst + c * kBlockBytes, map, bar, c * kColBlock, head, row0, batch);
}

// Copies this CTA's share of the K or V tile of `map` at (row0, head, batch)
// into every CTA of the cluster: column blocks [rank n, rank n + n), n =
// kD / 64 / kCluster (kCluster 1: the whole tile, load_tile).
template <int kD, int kRows, int kCluster>
__device__ __forceinline__ void load_kv_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                             int row0, int head, int batch, uint32_t rank) {
  if constexpr (kCluster == 1) {
    load_tile<kD, kRows>(dst, map, bar, row0, head, batch);
  } else {
    constexpr uint32_t kBlockBytes = uint32_t(kRows) * kSwizzleBytes;
    constexpr int kShare = kD / kColBlock / kCluster;
    constexpr uint16_t kAllCtas = uint16_t((1u << kCluster) - 1);
#pragma unroll
    for (int i = 0; i < kShare; ++i) {
      const int c = int(rank) * kShare + i;
      ptx::tma_load_4d_multicast(dst + c * kBlockBytes, map, bar, kAllCtas, c * kColBlock, head,
                                 row0, batch);
    }
  }
}

// Run by exactly one thread of the CTA: every work tile of the CTA's
// schedule in order. Visits of K/V are counted across tiles (`it` is never
// reset), exactly as the consumers count. Q of the CTA's t-th tile is
// loaded in phase t & 1 of q_full; for t >= 1 only after phase (t - 1) & 1
// of q_empty, which the consumers complete once no GEMM reads Q any more.
// kVarlen: the tiles of a varlen batch (tile_schedule.cuh work_tile), the
// empty ones skipped as the consumers skip them, so `t` counts the loaded.
template <class Tile, int kCluster, bool kVarlen>
__device__ __forceinline__ void produce(const ForwardParams& p, const MaskPolicy& batch_mask,
                                        const TileSchedule<kCluster>& schedule, uint32_t smem) {
  using L = SmemLayout<Tile>;
  constexpr int kD = Tile::kD;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kStages = Tile::kStages;

  ptx::tma_prefetch(&p.q_map);
  ptx::tma_prefetch(&p.k_map);
  ptx::tma_prefetch(&p.v_map);
  const uint32_t rank = kCluster > 1 ? ptx::cluster_ctarank() : 0u;

  int it = 0;
  int loaded = 0;  // varlen: the tiles not skipped so far
  for (int k = 0; schedule.valid(k); ++k) {
    MaskPolicy mask = batch_mask;
    const TileCoord tile = work_tile<Tile, kVarlen>(p, int(schedule.index(k)), mask);
    if constexpr (kVarlen) {
      if (tile.empty) continue;
    }
    const int t = kVarlen ? loaded++ : k;
    if (t > 0) ptx::mbar_wait(smem + L::kQEmpty, uint32_t(t - 1) & 1u);
    ptx::mbar_arrive_expect_tx(smem + L::kQFull, L::kQBytes);
    // Packed (pack_gqa.hpp), the box spans the kv head's query heads from
    // tile.h and kBlockM >> pack_shift queries: its rows land in the packed
    // order.
    load_tile<kD, Tile::kBlockM>(smem + L::kQ, &p.q_map, smem + L::kQFull,
                                 tile.q_row0 + (tile.m0 >> p.pack_shift), tile.h, tile.tb);

    for (int n_block = tile.keys.last; n_block >= tile.keys.first; --n_block, ++it) {
      const int stage = it % kStages;
      const uint32_t parity = uint32_t(it / kStages) & 1u;
      const int n0 = n_block * kBN;
      const uint32_t bar_off = uint32_t(stage) * L::kBarrierBytes;

      ptx::mbar_wait(smem + L::kKEmpty + bar_off, parity ^ 1u);
      ptx::mbar_arrive_expect_tx(smem + L::kKFull + bar_off, L::kKVBytes);
      load_kv_tile<kD, kBN, kCluster>(smem + L::kK + stage * L::kKVBytes, &p.k_map,
                                      smem + L::kKFull + bar_off, tile.k_row0 + n0, tile.hk,
                                      tile.tb, rank);

      ptx::mbar_wait(smem + L::kVEmpty + bar_off, parity ^ 1u);
      ptx::mbar_arrive_expect_tx(smem + L::kVFull + bar_off, L::kKVBytes);
      load_kv_tile<kD, kBN, kCluster>(smem + L::kV + stage * L::kKVBytes, &p.v_map,
                                      smem + L::kVFull + bar_off, tile.k_row0 + n0, tile.hk,
                                      tile.tb, rank);
    }
  }
}

}  // namespace gqattn::hopper
