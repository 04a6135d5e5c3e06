// cuda-hopper: the order of work tiles — which (query tile, batch, query
// head) a linear tile index of the forward names, and which key tile or
// query tile a block index of the backward's grids names (below). Plain
// integer code for host and device, so that
// tests/cpu/test_hopper_tile_order.cpp checks on the CPU that every order
// is a bijection onto the work tiles.
//
// The forward's two orders (TileSchedule, tile_schedule.cuh, deals the
// indices to the CTAs):
// - longest first (causal or windowed problems, whose query tiles visit
//   different numbers of key tiles): query-tile major, the last query tile
//   first, every (batch, head) of one query tile in a row; the longest tiles
//   then run first and a round of the persistent schedule holds tiles of
//   about one length;
// - kv-grouped (neither mask: every tile is as long as every other, so no
//   order balances better than another): groups of `pairs` (batch, kv head)
//   pairs, each group's query tiles in turn, the pairs of the group and the
//   query heads of each pair innermost. The CTAs working at one time then
//   share the K/V of a few pairs, which stay in L2, where the longest-first
//   order has every CTA of a round on a different (batch, head) and streams
//   the K/V of all of them at once (Nsight Compute, d128 non-causal B4 T4k
//   H32/8: L2 hit rate 65%, DRAM 28% of peak;
//   docs/decisions/hopper-forward-kv-grouped-order.md).
// In both, consecutive indices are consecutive query heads of one query tile
// and batch wherever the GQA group has more than one head (K/V multicast's
// units, tile_schedule.cuh).
#pragma once

#include "cuda/fused/host_device.hpp"

namespace gqattn::hopper {

struct TileOrderArgs {
  int B, H, Hkv;
  int num_m;  // query tiles per (batch, head)
  int pairs;  // (batch, kv head) pairs per group; 0: longest first
};

struct TileId {
  int m_block, b, h;
};

GQATTN_HD TileId tile_id(const TileOrderArgs& a, int index) {
  TileId t;
  if (a.pairs <= 0) {
    const int num_bh = a.B * a.H;
    t.m_block = a.num_m - 1 - index / num_bh;
    const int bh = index % num_bh;
    t.b = bh / a.H;
    t.h = bh % a.H;
    return t;
  }
  const int group = a.H / a.Hkv;  // query heads per kv head
  const int num_pairs = a.B * a.Hkv;
  const int per_group = a.pairs * a.num_m * group;  // tiles of a full group
  const int first_pair = index / per_group * a.pairs;
  const int pairs_here = a.pairs < num_pairs - first_pair ? a.pairs : num_pairs - first_pair;
  const int within = index % per_group;
  const int per_m = pairs_here * group;  // tiles of one query tile in this group
  t.m_block = a.num_m - 1 - within / per_m;
  const int pair = first_pair + within % per_m / group;
  t.b = pair / a.Hkv;
  t.h = pair % a.Hkv * group + within % group;
  return t;
}

// A varlen batch's query tiles (tile_schedule.cuh varlen_tile_coord): query
// tile m_block of num_m (over max_seqlen_q) of a sequence of tq rows (or
// packed rows) starts at row m0; end_aligned (causal, not packed) counts
// the tiles from the sequence's end, in whole warpgroups of `wg_rows` rows
// (query_tile_shift's rule with up to num_m tiles of spare rows), else from
// row 0. A tile is empty where it holds no row of [0, tq).
struct VarlenQueryTile {
  int m0;
  bool empty;
};
GQATTN_HD VarlenQueryTile varlen_query_tile(int m_block, int num_m, int block_m, int wg_rows,
                                            int tq, bool end_aligned) {
  const int shift = end_aligned ? (num_m * block_m - tq) / wg_rows * wg_rows : 0;
  const int m0 = m_block * block_m - shift;
  return {m0, m0 >= tq || m0 + block_m <= 0};
}

// The backward's grids (one CTA per tile, dispatched in block-index order).
// The dQ grid takes tile_id's longest-first order. The dK/dV grid runs the
// key tiles of each (batch, kv head) pair from the first (under a causal
// mask the longest) up, pairs innermost: tile_id over the kv heads alone
// (one query head per kv head), its query tile order reversed. Within a
// pair the key tiles keep increasing indices in every grouping, which the
// fused dQ's ordered adds rely on (backward_dkdv_kernel.cuh).
struct KeyTileId {
  int n_block, b, hk;
};

GQATTN_HD KeyTileId key_tile_id(int B, int Hkv, int num_n, int pairs, int index) {
  const TileId t = tile_id(TileOrderArgs{B, Hkv, Hkv, num_n, pairs}, index);
  return KeyTileId{num_n - 1 - t.m_block, t.b, t.h};
}

}  // namespace gqattn::hopper
