// cuda-hopper's forward tile choice (src/cuda/hopper/forward/tile_sizes.hpp
// forward_shape), without a GPU: which problems run on the wide d128 key
// tile or on the tall d64 tile, as docs/backends/cuda-hopper.md describes it
// (d128 wide: neither causal nor window, no softcap; d64 tall: no softcap,
// no window, Tk >= kTallD64MinKeys, whatever Tq; d256 always the default),
// and that every tile fits sm_90's shared memory and a TMA box, and has the
// thread layout its rows need. The plan (plan.cpp) calls forward_shape once
// and the host and the launcher both read the plan, so pinning it pins both.
#include <gtest/gtest.h>

#include "cuda/hopper/forward/tile_sizes.hpp"

namespace {

using gqattn::hopper::consumer_warpgroups;
using gqattn::hopper::forward_shape;
using gqattn::hopper::forward_smem_bytes;
using gqattn::hopper::forward_threads;
using gqattn::hopper::forward_tile_dims;
using gqattn::hopper::ForwardTile;
using gqattn::hopper::kTallD64MinKeys;
using gqattn::hopper::TileShape;

constexpr std::size_t kSm90SmemOptIn = 227 * 1024;
// Aliases: a template argument list's comma would split a gtest macro's
// arguments.
using D64 = ForwardTile<64>;
using D64Tall = ForwardTile<64, TileShape::kTall>;
using D128 = ForwardTile<128>;
using D128Wide = ForwardTile<128, TileShape::kWide>;
using D256 = ForwardTile<256>;

TEST(HopperTileChoice, D128WideOnlyWithoutCausalMaskOrWindow) {
  const TileShape plain = TileShape::kWide;
  EXPECT_EQ(forward_shape(128, /*causal=*/false, /*window=*/0, /*tq=*/4096, /*tk=*/4096, false),
            plain);
  EXPECT_EQ(forward_shape(128, false, 0, 37, 37, false), plain);
  EXPECT_EQ(forward_shape(128, /*causal=*/true, 0, 4096, 4096, false), TileShape::kDefault);
  EXPECT_EQ(forward_shape(128, false, /*window=*/64, 4096, 4096, false), TileShape::kDefault);
  EXPECT_EQ(forward_shape(128, false, 0, 4096, 4096, /*softcap=*/true), TileShape::kDefault);
}

TEST(HopperTileChoice, D64TallOnlyForLongProblemsWithoutSoftcapOrWindow) {
  const TileShape tall = TileShape::kTall;
  for (const bool causal : {false, true})
    for (const int tk : {kTallD64MinKeys, 16384})
      EXPECT_EQ(forward_shape(64, causal, /*window=*/0, tk, tk, false), tall)
          << "causal " << causal << " tk " << tk;
  EXPECT_EQ(forward_shape(64, true, 0, kTallD64MinKeys - 1, kTallD64MinKeys - 1, false),
            TileShape::kDefault);
  EXPECT_EQ(forward_shape(64, false, 0, 512, 512, false), TileShape::kDefault);
  EXPECT_EQ(forward_shape(64, true, 0, 37, 37, false), TileShape::kDefault);
  EXPECT_EQ(forward_shape(64, true, /*window=*/1024, 16384, 16384, false), TileShape::kDefault);
  EXPECT_EQ(forward_shape(64, true, 0, 16384, 16384, /*softcap=*/true), TileShape::kDefault);
}

TEST(HopperTileChoice, D64TallWhateverTheQueries) {
  // Decoding (Tq 1) with enough keys takes the tall tile too: Tk decides.
  for (const int tq : {1, 16, 64, 191, 192, 16384})
    EXPECT_EQ(forward_shape(64, /*causal=*/false, 0, tq, /*tk=*/8192, false), TileShape::kTall)
        << "tq " << tq;
}

TEST(HopperTileChoice, D256AlwaysTheDefault) {
  for (const bool causal : {false, true})
    for (const bool softcap : {false, true})
      EXPECT_EQ(forward_shape(256, causal, 0, 16384, 16384, softcap), TileShape::kDefault);
}

TEST(HopperTileChoice, EveryTileFitsSharedMemoryAndATmaBox) {
  EXPECT_LE(forward_smem_bytes<D64>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D64Tall>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D128>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D128Wide>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D256>(), kSm90SmemOptIn);
  // A wide tile is wider than its head dimension's default, on the same
  // query rows; the tall one has 1.5x the default's query rows, one
  // consumer warpgroup more, on the same key rows.
  EXPECT_GT(D128Wide::kBlockN, D128::kBlockN);
  EXPECT_EQ(D128Wide::kBlockM, D128::kBlockM);
  EXPECT_EQ(D64Tall::kBlockM, 192);
  EXPECT_EQ(D64Tall::kBlockN, D64::kBlockN);
  EXPECT_EQ(consumer_warpgroups<D64Tall>(), 3);
  EXPECT_EQ(forward_threads<D64Tall>(), 512);
  EXPECT_EQ(forward_threads<D128>(), 384);
}

TEST(HopperTileChoice, TheHostSeesTheLaunchersTile) {
  // forward_tile_dims gives the host the dims of the instance the launcher
  // picks for the same shape.
  EXPECT_EQ(forward_tile_dims(64, TileShape::kTall).block_m, D64Tall::kBlockM);
  EXPECT_EQ(forward_tile_dims(64, TileShape::kDefault).block_m, D64::kBlockM);
  EXPECT_EQ(forward_tile_dims(128, TileShape::kWide).block_n, D128Wide::kBlockN);
  EXPECT_EQ(forward_tile_dims(128, TileShape::kDefault).smem_bytes, forward_smem_bytes<D128>());
  EXPECT_EQ(forward_tile_dims(256, TileShape::kDefault).block_n, D256::kBlockN);
}

}  // namespace
