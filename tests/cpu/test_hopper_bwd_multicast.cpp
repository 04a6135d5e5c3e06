// The backward's Q / dO multicast grid (src/cuda/hopper/backward_multicast.hpp),
// without a GPU: the clustered dK/dV grid names every key tile once, with the
// two CTAs of a cluster on key tiles 2i and 2i + 1 of one (batch, kv head)
// and lower key tiles first; multicast_steps gives a count of steps at which
// both walks visit the same (query tile, head), step for step, and under a
// causal mask or none that is every step of the shorter walk.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/hopper/backward_multicast.hpp"

namespace {

using gqattn::hopper::KeyTileId;
using gqattn::hopper::bwd::clustered_key_tile_id;
using gqattn::hopper::bwd::kBwdClusterCtas;
using gqattn::hopper::bwd::multicast_steps;

struct Grid {
  int B, Hkv, num_n;
};

// Odd key-tile counts (a padding CTA), one key tile, MQA, many pairs.
const Grid kGrids[] = {{4, 8, 32}, {1, 8, 128}, {2, 3, 5}, {3, 7, 1}, {1, 1, 9}, {5, 4, 2}};

TEST(HopperBwdMulticast, ClusteredGridNamesEveryKeyTileOnceInClustersOfNeighbours) {
  for (const Grid& g : kGrids)
    for (int pairs : {0, 1, 3, 8, 1000}) {
      const int positions = (g.num_n + 1) / 2;
      const int blocks = kBwdClusterCtas * positions * g.B * g.Hkv;
      std::set<std::tuple<int, int, int>> seen;
      std::vector<int> next_n(g.B * g.Hkv, 0);
      int padding = 0;
      for (int i = 0; i < blocks; ++i) {
        const KeyTileId t = clustered_key_tile_id(g.B, g.Hkv, g.num_n, pairs, i);
        ASSERT_TRUE(t.b >= 0 && t.b < g.B && t.hk >= 0 && t.hk < g.Hkv && t.n_block >= 0)
            << "pairs " << pairs << " index " << i;
        ASSERT_EQ(t.n_block % kBwdClusterCtas, i % kBwdClusterCtas)
            << "rank = key tile parity, index " << i;
        if (i % kBwdClusterCtas == 1) {
          const KeyTileId partner = clustered_key_tile_id(g.B, g.Hkv, g.num_n, pairs, i - 1);
          ASSERT_TRUE(partner.b == t.b && partner.hk == t.hk && partner.n_block + 1 == t.n_block)
              << "pairs " << pairs << " index " << i << ": the cluster is not two neighbours";
        }
        if (t.n_block >= g.num_n) {
          ASSERT_EQ(t.n_block, g.num_n) << "only the padding key tile lies past the end";
          ++padding;
          continue;
        }
        ASSERT_TRUE(seen.emplace(t.n_block, t.b, t.hk).second)
            << "pairs " << pairs << " index " << i << " names a key tile twice";
        EXPECT_EQ(t.n_block, next_n[t.b * g.Hkv + t.hk]++)
            << "pairs " << pairs << " index " << i << ": a key tile before a lower one";
      }
      EXPECT_EQ(int(seen.size()), g.num_n * g.B * g.Hkv);
      EXPECT_EQ(padding, g.num_n % 2 * g.B * g.Hkv);
    }
}

// The (query tile, head) of step t of a walk over query tiles [first,
// last], last first, `group` heads per tile (DkdvWork).
std::pair<int, int> step_of(int last, int group, int t) { return {last - t / group, t % group}; }

TEST(HopperBwdMulticast, SharedStepsVisitTheSameQueryTileAndHeadInBothWalks) {
  const int group = 3;
  for (int f0 = 0; f0 < 6; ++f0)
    for (int l0 = f0 - 1; l0 < 8; ++l0)
      for (int f1 = 0; f1 < 6; ++f1)
        for (int l1 = f1 - 1; l1 < 8; ++l1) {
          const int shared = multicast_steps(f0, l0, f1, l1, group);
          EXPECT_EQ(shared, multicast_steps(f1, l1, f0, l0, group)) << "symmetric";
          const int own_steps = l0 >= f0 ? (l0 - f0 + 1) * group : 0;
          const int peer_steps = l1 >= f1 ? (l1 - f1 + 1) * group : 0;
          ASSERT_LE(shared, own_steps);
          ASSERT_LE(shared, peer_steps);
          for (int t = 0; t < shared; ++t)
            ASSERT_EQ(step_of(l0, group, t), step_of(l1, group, t))
                << "own [" << f0 << ", " << l0 << "] peer [" << f1 << ", " << l1 << "] step " << t;
          // Walks ending at one query tile share the whole shorter walk.
          if (l0 == l1 && own_steps > 0 && peer_steps > 0)
            EXPECT_EQ(shared, own_steps < peer_steps ? own_steps : peer_steps);
          else
            EXPECT_EQ(shared, 0);
        }
}

TEST(HopperBwdMulticast, CausalNeighboursShareAllButTheLowerTilesDiagonal) {
  // Key tiles 0 and 1 (128 keys) of a causal T = 1000, query tiles of 64:
  // tile 0 is visited by query tiles 0..15, tile 1 by 2..15; 4 heads.
  EXPECT_EQ(multicast_steps(0, 15, 2, 15, 4), 14 * 4);
  // A window shifts the walks' ends apart: nothing shared.
  EXPECT_EQ(multicast_steps(0, 5, 2, 7, 4), 0);
  // The padding CTA of an odd number of key tiles visits nothing.
  EXPECT_EQ(multicast_steps(0, 15, 0, -1, 4), 0);
}

}  // namespace
