// cuda-flash's choice of dK/dV tile by the device's shared memory per block
// (tile_sizes.hpp: use_small_smem_dkdv_tile, backward_min_smem_bytes): plain C++, so
// checked here without a GPU. d64's default 128-query tile needs 162 KB,
// which an A100 (163 KB) has and sm86 / sm89 GPUs (99 KB) do not; there the
// 64-query tile runs. The GPU tests run the small tile on the H200 through
// GQATTN_FLASH_DKDV_TILE=small (tests/gpu/test_flash_correctness.cpp).
#include <gtest/gtest.h>

#include <cstddef>

#include "cuda/flash/tile_sizes.hpp"

namespace {

using namespace gqattn::flash;

constexpr std::size_t kKB = 1024;
constexpr std::size_t kSm86OptinSmem = 99 * kKB;
constexpr std::size_t kSm80OptinSmem = 163 * kKB;
constexpr std::size_t kSm90OptinSmem = 227 * kKB;

TEST(FlashTileChoice, D64TakesTheSmallTileOnlyWhereTheDefaultDoesNotFit) {
  if (!has_small_smem_dkdv_tile(64)) GTEST_SKIP() << "kDkdvD64QueryTile128 is off";
  EXPECT_TRUE(use_small_smem_dkdv_tile(64, kSm86OptinSmem));
  EXPECT_FALSE(use_small_smem_dkdv_tile(64, kSm80OptinSmem));
  EXPECT_FALSE(use_small_smem_dkdv_tile(64, kSm90OptinSmem));
  EXPECT_FALSE(use_small_smem_dkdv_tile(64, dkdv_max_smem_bytes<64>()));
  EXPECT_TRUE(use_small_smem_dkdv_tile(64, dkdv_max_smem_bytes<64>() - 1));
}

TEST(FlashTileChoice, OnlyD64HasASmallTile) {
  for (std::size_t smem : {kSm86OptinSmem, kSm80OptinSmem, kSm90OptinSmem}) {
    EXPECT_FALSE(use_small_smem_dkdv_tile(128, smem));
    EXPECT_FALSE(use_small_smem_dkdv_tile(256, smem));
  }
}

TEST(FlashTileChoice, TheSmallTileFitsWhereTheDefaultDoesNot) {
  if (!has_small_smem_dkdv_tile(64)) GTEST_SKIP() << "kDkdvD64QueryTile128 is off";
  EXPECT_GT(dkdv_max_smem_bytes<64>(), kSm86OptinSmem);
  EXPECT_LE(dkdv_max_smem_bytes<64>(), kSm80OptinSmem);
  EXPECT_LE((dkdv_max_smem_bytes<64, true>()), kSm86OptinSmem);
  // What the backend asks of a device for d64's backward: every backward
  // kernel with the small tile.
  EXPECT_LE(backward_min_smem_bytes<64>(), kSm86OptinSmem);
  EXPECT_EQ((DkdvTile<64, true>::kBlockM), 64);
}

// The forward needs less than the backward at every d, and fits the sm86 /
// sm89 limit at every d (so a forward runs there even where the backward
// does not: d128, d256, as of this writing).
TEST(FlashTileChoice, TheForwardNeedsLessThanTheBackward) {
  EXPECT_LE(forward_smem_bytes<64>(), backward_min_smem_bytes<64>());
  EXPECT_LE(forward_smem_bytes<128>(), backward_min_smem_bytes<128>());
  EXPECT_LE(forward_smem_bytes<256>(), backward_min_smem_bytes<256>());
  EXPECT_LE(forward_smem_bytes<128>(), kSm86OptinSmem);
  EXPECT_LE(forward_smem_bytes<256>(), kSm86OptinSmem);
}

TEST(FlashTileChoice, D64OnTheSmallTileDefaultsToTheSeparateDq) {
  EXPECT_EQ(default_dq_strategy(64, true, 4096, /*small_smem_dkdv_tile=*/true),
            DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(64, false, 1024, /*small_smem_dkdv_tile=*/true),
            DqStrategy::kSeparate);
}

}  // namespace
