// cuda-hopper's forward tile choice (src/cuda/hopper/tile_sizes.hpp
// forward_wide), without a GPU: which problems run on a wide key tile, as
// docs/hopper.md describes it (d128: neither causal nor window, no softcap;
// d64: no softcap, no window, Tk >= kWideD64MinKeys; d256 never), and that
// every tile fits sm_90's shared memory and a TMA box. The host (TMA box
// rows, the shared-memory check) and the launcher (kernel instance) both
// call forward_wide, so pinning it pins both.
#include <gtest/gtest.h>

#include "cuda/hopper/tile_sizes.hpp"

namespace {

using gqattn::hopper::forward_smem_bytes;
using gqattn::hopper::forward_wide;
using gqattn::hopper::ForwardTile;
using gqattn::hopper::kWideD64;
using gqattn::hopper::kWideD64MinKeys;
using gqattn::hopper::kWideNonCausalD128;
using gqattn::hopper::kWideSoftcapD128;

constexpr std::size_t kSm90SmemOptIn = 227 * 1024;
// Aliases: a template argument list's comma would split a gtest macro's
// arguments.
using D64 = ForwardTile<64>;
using D64Wide = ForwardTile<64, true>;
using D128 = ForwardTile<128>;
using D128Wide = ForwardTile<128, true>;
using D256 = ForwardTile<256>;

TEST(HopperTileChoice, D128WideOnlyWithoutCausalMaskOrWindow) {
  const bool plain = kWideNonCausalD128;
  EXPECT_EQ(forward_wide(128, /*causal=*/false, /*window=*/0, /*tk=*/4096, false), plain);
  EXPECT_EQ(forward_wide(128, false, 0, 37, false), plain);
  EXPECT_FALSE(forward_wide(128, /*causal=*/true, 0, 4096, false));
  EXPECT_FALSE(forward_wide(128, false, /*window=*/64, 4096, false));
  EXPECT_EQ(forward_wide(128, false, 0, 4096, /*softcap=*/true),
            kWideNonCausalD128 && kWideSoftcapD128);
}

TEST(HopperTileChoice, D64WideOnlyForLongProblemsWithoutSoftcapOrWindow) {
  EXPECT_EQ(forward_wide(64, /*causal=*/true, 0, kWideD64MinKeys, false), kWideD64);
  EXPECT_EQ(forward_wide(64, /*causal=*/false, 0, 16384, false), kWideD64);
  EXPECT_FALSE(forward_wide(64, true, 0, kWideD64MinKeys - 1, false));
  EXPECT_FALSE(forward_wide(64, false, 0, 1024, false));
  EXPECT_FALSE(forward_wide(64, true, /*window=*/1024, 16384, false));
  EXPECT_FALSE(forward_wide(64, true, 0, 16384, /*softcap=*/true));
}

TEST(HopperTileChoice, D256NeverWide) {
  for (const bool causal : {false, true})
    for (const bool softcap : {false, true})
      EXPECT_FALSE(forward_wide(256, causal, 0, 16384, softcap));
}

TEST(HopperTileChoice, EveryTileFitsSharedMemoryAndATmaBox) {
  EXPECT_LE(forward_smem_bytes<D64>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D64Wide>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D128>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D128Wide>(), kSm90SmemOptIn);
  EXPECT_LE(forward_smem_bytes<D256>(), kSm90SmemOptIn);
  // A wide tile is wider than its head dimension's default, on the same
  // query rows (the launcher counts query tiles by the default's kBlockM).
  EXPECT_GT(D64Wide::kBlockN, D64::kBlockN);
  EXPECT_GT(D128Wide::kBlockN, D128::kBlockN);
  EXPECT_EQ(D64Wide::kBlockM, D64::kBlockM);
  EXPECT_EQ(D128Wide::kBlockM, D128::kBlockM);
}

}  // namespace
