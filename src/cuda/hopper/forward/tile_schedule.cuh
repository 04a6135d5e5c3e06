// cuda-hopper: which work tiles a CTA owns — (query tile, head, batch) from
// a linear tile index (in the order of tile_order.hpp: longest first, or
// kv-grouped where all tiles are equally long), the kv head of its GQA
// group, and the key tiles the mask policy says it visits. Under a causal
// mask the query tiles end at Tq's last row (query_tile_shift), so the
// first tile may start before row 0.
// TileSchedule deals the indices to the CTAs of the (1-D) grid: CTA c takes,
// in round r, index r * G + c (r even) or r * G + G - 1 - c (r odd), G =
// gridDim.x. The order is fixed (deterministic, no atomics) and the same in
// the producer and the consumers of a CTA; serpentine rounds cancel the bias
// a plain stride would give CTA 0 (always the longest tile of a round).
// With clusters of kCluster CTAs (K/V multicast, tile_sizes.hpp) the same
// is dealt in units of kCluster consecutive indices, one unit per cluster,
// and the CTA of rank r takes index kCluster unit + r: consecutive indices
// are consecutive query heads of the same query tile and batch, so a unit's
// tiles visit the same key tiles.
// Split-KV (split_kv.hpp, ForwardParams::num_splits > 1): each work tile is
// num_splits consecutive tasks, each visiting one range of its key tiles.
// Packed GQA (pack_gqa.hpp, ForwardParams::pack_shift > 0): a tile's rows are
// the (query, head) pairs of all query heads of one kv head, so tiles are
// dealt over (query tile, kv head, batch) and m0 counts packed rows.
// Varlen batches (varlen_tile_coord): tiles dealt over max_seqlen_q in the
// longest-first order, each sequence's tiles end-aligned to its own end
// under a causal mask; a tile holding none of its sequence's rows comes
// back `empty` and the producer and consumers skip it without a barrier
// (docs/decisions/hopper-varlen-forward.md).
// Checked through tests/gpu/test_hopper_forward.cpp and
// tests/gpu/test_hopper_varlen_forward.cpp.
#pragma once

#include <cstdint>

#include "cuda/fused/mask.cuh"
#include "cuda/fused/sequence.hpp"
#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/forward/split_kv.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/tile_order.hpp"

namespace gqattn::hopper {

using fused::BlockRange;
using fused::MaskPolicy;

struct TileCoord {
  int m0;           // first query row of the tile: negative on the first tile
                    // of a shifted problem (query_tile_shift), a multiple of
                    // kWgmmaM rows before row 0; packed: first packed row,
                    // query m0 >> pack_shift
  int b, h, hk;     // batch, query head (packed: the kv head's first), kv head
  int split;        // split-KV (split_kv.hpp): which range of the tile's key tiles
  BlockRange keys;  // key tiles visited, walked from keys.last down to keys.first
  // Where the tile's rows live in the tensors: batch tb, query rows from
  // q_row0 + m0, key rows from k_row0 (dense: tb = b, rows from 0; varlen:
  // the packed [1, total, heads, d] views, tb = 0, the sequence's first rows).
  int tb = 0;
  int q_row0 = 0, k_row0 = 0;
  bool empty = false;  // varlen: no row of the sequence in the tile (skipped)
};

// The work tiles of this CTA, in order: k-th tile index(k) while valid(k).
// kCluster: CTAs per cluster (1, or 2 with K/V multicast; num_tiles is then
// a multiple of it, so the CTAs of a cluster agree on valid()).
template <int kCluster>
struct TileSchedule {
  int64_t num_tiles;

  __device__ __forceinline__ int64_t index(int k) const {
    const int64_t units = gridDim.x / kCluster;  // clusters in the grid
    const int64_t cluster = blockIdx.x / kCluster;
    const int64_t c = (k & 1) ? units - 1 - cluster : cluster;
    // A 1-D grid of clusters along x: blockIdx.x % kCluster is the rank
    // (%cluster_ctarank) the producer's share of each K/V tile follows.
    return (int64_t(k) * units + c) * kCluster + blockIdx.x % kCluster;
  }
  // Rounds only grow, so the first invalid k ends the CTA's list.
  __device__ __forceinline__ bool valid(int k) const { return index(k) < num_tiles; }
};

// The tile order's arguments for problem p on Tile: kv-grouped
// (Tile::kKvGroupPairs pairs) where every tile visits every key tile, else
// longest first (docs/decisions/hopper-forward-kv-grouped-order.md).
// Packed, the "heads" of the order are the kv heads.
template <class Tile>
__device__ __forceinline__ TileOrderArgs tile_order_args(const ForwardParams& p) {
  const int pairs = p.mask.keeps_all_pairs() ? Tile::kKvGroupPairs : 0;
  const int heads = tile_heads(p);
  return TileOrderArgs{p.B, heads, p.Hkv, p.num_tiles / p.num_splits / (p.B * heads), pairs};
}

// How many rows before row 0 the first query tile starts
// (docs/decisions/hopper-forward-end-aligned-causal-tiles.md): under a
// causal mask the last tile visits every
// key tile and the first the fewest, so the rows that round Tq up to whole
// tiles go before the first tile's rows rather than after the last's, in
// whole warpgroups (64 rows: a warpgroup has rows either all before row 0
// or all from row 0 on, the epilogue's unit). 0 without a causal mask
// (every tile visits the same key tiles) and where Tq is a multiple of
// kBlockM. Not on packed tiles (tile_coord), whose rows before 0 would not
// be whole queries of every head.
template <class Tile>
__device__ __forceinline__ int query_tile_shift(const MaskPolicy& mask, int num_m) {
  if (!mask.causal) return 0;
  const int spare_rows = num_m * Tile::kBlockM - mask.tq;  // in [0, kBlockM)
  return spare_rows / kWgmmaM * kWgmmaM;
}

// The task of index `index`: work tile index / num_splits, its split
// index % num_splits (the splits of a tile are consecutive tasks, so they
// run side by side).
template <class Tile>
__device__ __forceinline__ TileCoord tile_coord(const ForwardParams& p, const MaskPolicy& mask,
                                                int index) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  TileCoord c;
  const TileOrderArgs order = tile_order_args<Tile>(p);
  c.split = index % p.num_splits;
  const TileId id = tile_id(order, index / p.num_splits);
  c.b = id.b;
  c.tb = id.b;
  // Packed: id.h is the kv head, and its first query head is hk << shift.
  c.h = id.h << p.pack_shift;
  c.hk = c.h / (p.H / p.Hkv);
  c.m0 = id.m_block * kBlockM - (p.pack_shift > 0 ? 0 : query_tile_shift<Tile>(mask, order.num_m));
  c.keys = mask.key_blocks(c.m0, kBlockM, kBlockN, p.pack_shift);
  if (p.num_splits > 1) {
    const KeyTileRange r = split_key_tiles(c.keys.first, c.keys.last, c.split, p.num_splits);
    c.keys = BlockRange{r.first, r.last};
  }
  return c;
}

// The task of index `index` of a varlen batch, and `mask`, its sequence's
// mask. Not the kv-grouped order (it assumes equally long tiles): tiles
// over B x tile_heads x num_m, num_m the query tiles of max_seqlen_q
// (packed: of its packed rows), in the longest-first order, each
// num_splits consecutive tasks as in tile_coord.
// Under a causal mask an unpacked sequence's tiles are end-aligned like a
// dense problem's (query_tile_shift), only with up to num_m tiles of spare
// rows: its last tile is index m_block num_m - 1, the longest of every
// sequence, and the tiles wholly before row 0 are empty. Otherwise the
// tiles from query tq_b on are. Rows before 0 or from tq_b on are masked
// and never stored (epilogue.cuh), so the other sequences' rows a Q load
// brings into them do no harm; key rows from tk_b on are masked.
template <class Tile>
__device__ __forceinline__ TileCoord varlen_tile_coord(const ForwardParams& p, int index,
                                                       MaskPolicy& mask) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  const int heads = tile_heads(p);
  const int num_m = p.num_tiles / p.num_splits / (p.B * heads);
  const TileId id = tile_id(TileOrderArgs{p.B, heads, p.Hkv, num_m, 0}, index / p.num_splits);
  const fused::Sequence seq = fused::sequence_of(p.seq, p.mask, id.b);
  mask = MaskPolicy(seq.mask);
  TileCoord c;
  c.b = id.b;
  c.h = id.h << p.pack_shift;  // packed: id.h is the kv head
  c.hk = c.h / (p.H / p.Hkv);
  c.split = index % p.num_splits;
  c.tb = 0;
  c.q_row0 = seq.q_row0;
  c.k_row0 = seq.k_row0;
  // Packed, in packed rows: tq << pack_shift (< 2^31: packed tiles are
  // dealt only where max_seqlen_q < kBlockM).
  const VarlenQueryTile q =
      varlen_query_tile(id.m_block, num_m, kBlockM, kWgmmaM, mask.tq << p.pack_shift,
                        mask.causal && p.pack_shift == 0);
  c.m0 = q.m0;
  c.empty = q.empty;
  c.keys = c.empty ? BlockRange{} : mask.key_blocks(c.m0, kBlockM, kBlockN, p.pack_shift);
  if (p.num_splits > 1) {
    const KeyTileRange r = split_key_tiles(c.keys.first, c.keys.last, c.split, p.num_splits);
    c.keys = BlockRange{r.first, r.last};
  }
  return c;
}

// The task of index `index` and its mask (`mask` is the batch's on entry;
// a varlen batch's tile gets its sequence's).
template <class Tile, bool kVarlen>
__device__ __forceinline__ TileCoord work_tile(const ForwardParams& p, int index,
                                               MaskPolicy& mask) {
  if constexpr (kVarlen)
    return varlen_tile_coord<Tile>(p, index, mask);
  else
    return tile_coord<Tile>(p, mask, index);
}

}  // namespace gqattn::hopper
