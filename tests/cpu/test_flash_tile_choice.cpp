// cuda-flash's choice of dK/dV tile by the device's shared memory per block
// (tile_sizes.hpp: use_small_smem_dkdv_tile, backward_min_smem_bytes): plain
// C++, so checked here without a GPU. The default tiles need 162 KB (d64),
// 161 KB (d128) and 209 KB (d256); an A100 allows 163 KB, sm86 / sm89 GPUs
// 99 KB, an H100 / H200 227 KB. Where the default does not fit, the small
// tile runs: d64 and d128 then fit sm86 / sm89, d256 fits sm80 only. The GPU
// tests run the small tiles on the H200 through GQATTN_FLASH_DKDV_TILE=small
// (tests/gpu/test_flash_correctness.cpp).
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "cuda/flash/smem_support.hpp"
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

TEST(FlashTileChoice, D128TakesTheSmallTileOnSm86Only) {
  EXPECT_TRUE(use_small_smem_dkdv_tile(128, kSm86OptinSmem));
  EXPECT_FALSE(use_small_smem_dkdv_tile(128, kSm80OptinSmem));
  EXPECT_FALSE(use_small_smem_dkdv_tile(128, kSm90OptinSmem));
  EXPECT_TRUE(use_small_smem_dkdv_tile(128, dkdv_max_smem_bytes<128>() - 1));
}

TEST(FlashTileChoice, D256TakesTheSmallTileBelowSm90) {
  EXPECT_TRUE(use_small_smem_dkdv_tile(256, kSm86OptinSmem));
  EXPECT_TRUE(use_small_smem_dkdv_tile(256, kSm80OptinSmem));
  EXPECT_FALSE(use_small_smem_dkdv_tile(256, kSm90OptinSmem));
  EXPECT_FALSE(use_small_smem_dkdv_tile(256, dkdv_max_smem_bytes<256>()));
}

TEST(FlashTileChoice, TheSmallTilesFitWhereTheDefaultsDoNot) {
  if (has_small_smem_dkdv_tile(64)) {
    EXPECT_GT(dkdv_max_smem_bytes<64>(), kSm86OptinSmem);
    EXPECT_LE(dkdv_max_smem_bytes<64>(), kSm80OptinSmem);
    EXPECT_LE((dkdv_max_smem_bytes<64, true>()), kSm86OptinSmem);
    EXPECT_EQ((DkdvTile<64, true>::kBlockM), 64);
  }
  EXPECT_GT(dkdv_max_smem_bytes<128>(), kSm86OptinSmem);
  EXPECT_LE(dkdv_max_smem_bytes<128>(), kSm80OptinSmem);
  EXPECT_LE((dkdv_max_smem_bytes<128, true>()), kSm86OptinSmem);
  EXPECT_GT(dkdv_max_smem_bytes<256>(), kSm80OptinSmem);
  EXPECT_LE(dkdv_max_smem_bytes<256>(), kSm90OptinSmem);
  EXPECT_LE((dkdv_max_smem_bytes<256, true>()), kSm80OptinSmem);
  // The small tiles keep the default's query tile (the ordered dQ's
  // counters and its postprocess count query tiles of kBlockM).
  EXPECT_EQ((DkdvTile<128, true>::kBlockM), DkdvTile<128>::kBlockM);
  EXPECT_EQ((DkdvTile<256, true>::kBlockM), DkdvTile<256>::kBlockM);
}

// What the backend asks of a device for the backward: every backward kernel,
// with the small tile. d64 and d128 run on every sm80+ GPU; d256 needs sm80's
// or sm90's shared memory, not sm86 / sm89's.
TEST(FlashTileChoice, TheBackwardRunsWhereItsSmallTileFits) {
  EXPECT_LE(backward_min_smem_bytes<64>(), kSm86OptinSmem);
  EXPECT_LE(backward_min_smem_bytes<128>(), kSm86OptinSmem);
  EXPECT_GT(backward_min_smem_bytes<256>(), kSm86OptinSmem);
  EXPECT_LE(backward_min_smem_bytes<256>(), kSm80OptinSmem);
}

// What the backend says to a device: nothing where the pass fits; where it
// does not, the pass, d and both figures.
TEST(FlashTileChoice, TheSupportMessageNamesThePassAndBothFigures) {
  for (int d : {64, 128, 256}) {
    EXPECT_EQ(why_too_little_smem(d, /*backward=*/false, kSm86OptinSmem), "");
    EXPECT_EQ(why_too_little_smem(d, /*backward=*/true, kSm80OptinSmem), "");
    EXPECT_EQ(why_too_little_smem(d, /*backward=*/true, kSm90OptinSmem), "");
  }
  EXPECT_EQ(why_too_little_smem(64, true, kSm86OptinSmem), "");
  EXPECT_EQ(why_too_little_smem(128, true, kSm86OptinSmem), "");
  EXPECT_EQ(why_too_little_smem(256, true, kSm86OptinSmem),
            "not supported: cuda-flash's backward at d=256 needs 145 KB of shared memory per "
            "block, the device allows 99 KB");
  // A device below even the forward's need (none of the sm80+ GPUs).
  const std::string forward = why_too_little_smem(256, false, 48 * kKB);
  EXPECT_EQ(forward,
            "not supported: cuda-flash's forward at d=256 needs 96 KB of shared memory per "
            "block, the device allows 48 KB");
}

// The dK/dV grid counts key tiles of the tile that runs.
TEST(FlashTileChoice, TheGridFollowsTheKeyTile) {
  EXPECT_EQ(dkdv_key_tile(128, false), 128);
  EXPECT_EQ(dkdv_key_tile(128, true), 64);
  EXPECT_EQ(dkdv_key_tile(256, true), dkdv_key_tile(256, false));
  EXPECT_EQ(dkdv_key_tile(64, true), dkdv_key_tile(64, false));
}

// The forward needs less than the backward at every d, and fits the sm86 /
// sm89 limit at every d (so a forward runs there even where the backward
// does not: d256).
TEST(FlashTileChoice, TheForwardNeedsLessThanTheBackward) {
  EXPECT_LE(forward_smem_bytes<64>(), backward_min_smem_bytes<64>());
  EXPECT_LE(forward_smem_bytes<128>(), backward_min_smem_bytes<128>());
  EXPECT_LE(forward_smem_bytes<256>(), backward_min_smem_bytes<256>());
  EXPECT_LE(forward_smem_bytes<128>(), kSm86OptinSmem);
  EXPECT_LE(forward_smem_bytes<256>(), kSm86OptinSmem);
}

}  // namespace
