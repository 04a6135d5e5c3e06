// cuda-hopper's forward tile orders (src/cuda/hopper/tile_order.hpp), without
// a GPU: each order names every work tile exactly once, the longest-first
// order runs query tiles from the last down, and the kv-grouped order keeps
// each run of consecutive indices (a persistent round) on few (batch, kv
// head) pairs, with the query heads of one pair and query tile adjacent.
// A varlen batch's query tiles (varlen_query_tile) hold every row of their
// sequence exactly once, rows before row 0 only in whole warpgroups, and
// are empty exactly where they hold no row.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <vector>

#include "cuda/hopper/backward/tile_sizes.hpp"
#include "cuda/hopper/tile_order.hpp"

namespace {

using gqattn::hopper::key_tile_id;
using gqattn::hopper::KeyTileId;
using gqattn::hopper::tile_id;
using gqattn::hopper::TileId;
using gqattn::hopper::TileOrderArgs;

struct Shape {
  int B, H, Hkv, num_m;
};

// Odd shapes too: MQA, no GQA, one query tile, a last group of fewer pairs.
const Shape kShapes[] = {{4, 32, 8, 32}, {1, 32, 8, 128}, {2, 24, 3, 5}, {3, 7, 7, 4},
                         {1, 16, 1, 9},  {5, 12, 4, 1},   {2, 4, 2, 3}};

TEST(HopperTileOrder, EveryOrderNamesEveryTileOnce) {
  for (const Shape& s : kShapes)
    for (int pairs : {0, 1, 3, 8, 1000}) {
      const TileOrderArgs a{s.B, s.H, s.Hkv, s.num_m, pairs};
      const int tiles = s.B * s.H * s.num_m;
      std::set<std::tuple<int, int, int>> seen;
      for (int i = 0; i < tiles; ++i) {
        const TileId t = tile_id(a, i);
        ASSERT_TRUE(t.m_block >= 0 && t.m_block < s.num_m && t.b >= 0 && t.b < s.B && t.h >= 0 &&
                    t.h < s.H)
            << "pairs " << pairs << " index " << i << ": m " << t.m_block << " b " << t.b << " h "
            << t.h;
        ASSERT_TRUE(seen.emplace(t.m_block, t.b, t.h).second)
            << "pairs " << pairs << " index " << i << " names a tile twice";
      }
    }
}

TEST(HopperTileOrder, LongestFirstRunsQueryTilesFromTheLast) {
  const TileOrderArgs a{2, 6, 3, 4, 0};
  for (int i = 0; i < 2 * 6 * 4; ++i) EXPECT_EQ(tile_id(a, i).m_block, 3 - i / 12) << i;
}

TEST(HopperTileOrder, KvGroupedRoundsStayOnFewPairs) {
  // d128 non-causal B4 T4k H32/8: 32 pairs, 32 query tiles; 8 pairs a group.
  const TileOrderArgs a{4, 32, 8, 32, 8};
  const int group = 32 / 8;
  for (int i = 0; i < 4 * 32 * 32; ++i) {
    const TileId t = tile_id(a, i);
    const int pair = t.b * 8 + t.h / group;
    EXPECT_EQ(pair / 8, i / (8 * 32 * group)) << i;  // the group's pairs only
    if (i % group != 0) {  // the next query head of the same pair and query tile
      const TileId prev = tile_id(a, i - 1);
      EXPECT_TRUE(prev.m_block == t.m_block && prev.b == t.b && prev.h + 1 == t.h) << i;
    }
  }
}

// The dK/dV grid: every (key tile, batch, kv head) once, and within each
// pair the key tiles in increasing index order (the fused dQ's ordered adds
// wait only on lower key tiles of the pair, dispatched before them).
TEST(HopperTileOrder, KeyTileOrderNamesEveryTileOnceLowKeyTilesFirst) {
  for (const Shape& s : kShapes)
    for (int pairs : {0, 1, 3, 8, 1000}) {
      const int num_n = s.num_m, num_pairs = s.B * s.Hkv;
      std::set<std::tuple<int, int, int>> seen;
      std::vector<int> next_n(num_pairs, 0);
      for (int i = 0; i < num_n * num_pairs; ++i) {
        const KeyTileId t = key_tile_id(s.B, s.Hkv, num_n, pairs, i);
        ASSERT_TRUE(t.n_block >= 0 && t.n_block < num_n && t.b >= 0 && t.b < s.B && t.hk >= 0 &&
                    t.hk < s.Hkv)
            << "pairs " << pairs << " index " << i;
        ASSERT_TRUE(seen.emplace(t.n_block, t.b, t.hk).second)
            << "pairs " << pairs << " index " << i << " names a key tile twice";
        EXPECT_EQ(t.n_block, next_n[t.b * s.Hkv + t.hk]++)
            << "pairs " << pairs << " index " << i << ": a key tile before a lower one of its pair";
      }
    }
}

TEST(HopperTileOrder, KeyTileOrderUngroupedIsKeyTileMajor) {
  for (int i = 0; i < 5 * 6; ++i) {
    const KeyTileId t = key_tile_id(2, 3, 5, 0, i);
    EXPECT_EQ(t.n_block, i / 6) << i;
    EXPECT_EQ(t.b * 3 + t.hk, i % 6) << i;
  }
}

// Which dK/dV grids are grouped, and by how many pairs, on the H200's 132
// multiprocessors (1.5 waves: 198 CTAs).
TEST(HopperTileOrder, KeyTileGroupsAreTheFewestPairsHoldingOneAndAHalfWaves) {
  using gqattn::hopper::bwd::dkdv_group_pairs;
  constexpr int kSms = 132;
  EXPECT_EQ(dkdv_group_pairs(32, 32, kSms, 8), 8);   // B4 T4k H32/8, 128-key tiles
  EXPECT_EQ(dkdv_group_pairs(32, 64, kSms, 8), 4);   // d256: 64-key tiles
  EXPECT_EQ(dkdv_group_pairs(8, 128, kSms, 8), 2);   // B1 T16k
  EXPECT_EQ(dkdv_group_pairs(128, 8, kSms, 8), 0);   // B16 T1k: 32 pairs needed, above the cap
  EXPECT_EQ(dkdv_group_pairs(12, 64, kSms, 8), 4);   // 3 pairs are 192 CTAs; 4 divide 12
  EXPECT_EQ(dkdv_group_pairs(14, 64, kSms, 8), 7);   // only 7 divides 14 with 1.5 waves
  EXPECT_EQ(dkdv_group_pairs(4, 99, kSms, 8), 2);    // 198 CTAs exactly
  EXPECT_EQ(dkdv_group_pairs(4, 98, kSms, 8), 0);    // 196; 4 pairs are all of them
  EXPECT_EQ(dkdv_group_pairs(1, 1000, kSms, 8), 0);  // one pair: nothing to group
  EXPECT_EQ(dkdv_group_pairs(32, 32, kSms, 0), 0);   // grouping off
}

// Every tile size (kBlockM 128, 192; warpgroups of 64 rows), every
// sequence length up to max_seqlen_q, end-aligned or not.
TEST(HopperTileOrder, VarlenQueryTilesHoldEverySequenceRowOnce) {
  using gqattn::hopper::varlen_query_tile;
  using gqattn::hopper::VarlenQueryTile;
  constexpr int kWg = 64;
  for (int block_m : {128, 192})
    for (int max_tq : {1, 63, 64, 127, 128, 129, 200, 383, 384, 1000})
      for (bool end_aligned : {false, true}) {
        const int num_m = (max_tq + block_m - 1) / block_m;
        for (int tq = 0; tq <= max_tq; ++tq) {
          std::vector<int> held(size_t(tq), 0);
          for (int m = 0; m < num_m; ++m) {
            const VarlenQueryTile t = varlen_query_tile(m, num_m, block_m, kWg, tq, end_aligned);
            int rows = 0;
            for (int r = t.m0; r < t.m0 + block_m; ++r)
              if (r >= 0 && r < tq) ++held[size_t(r)], ++rows;
            EXPECT_EQ(t.empty, rows == 0) << block_m << " " << tq << " " << m;
            // A warpgroup's rows are all before row 0 or none are.
            if (!t.empty && t.m0 < 0) {
              EXPECT_EQ(t.m0 % kWg, 0) << block_m << " " << tq;
            }
          }
          for (int r = 0; r < tq; ++r) EXPECT_EQ(held[size_t(r)], 1) << tq << " row " << r;
          // End-aligned: the last tile (dealt first) holds the sequence's last row.
          if (end_aligned && tq > 0) {
            const VarlenQueryTile last =
                varlen_query_tile(num_m - 1, num_m, block_m, kWg, tq, end_aligned);
            EXPECT_TRUE(last.m0 <= tq - 1 && tq - 1 < last.m0 + block_m) << block_m << " " << tq;
            // ... and reaches past it by less than a warpgroup.
            EXPECT_LT(last.m0 + block_m - tq, kWg) << block_m << " " << tq;
          }
        }
      }
}

}  // namespace
