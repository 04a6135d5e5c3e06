// cuda-flash's choice of dK/dV tile by the device's shared memory per block
// (tile_sizes.hpp: dkdv_tile_for_device, backward_min_smem_bytes): plain
// C++, so checked here without a GPU. The default tiles need 162 KB (d64),
// 161 KB (d128) and 209 KB (d256); an A100 allows 163 KB, sm86 / sm89 GPUs
// 99 KB, an H100 / H200 227 KB. Where the default does not fit, the largest
// smaller tile that does runs: d64 and d128's small tiles fit sm86 / sm89;
// d256's small one fits sm80, its smaller one sm86 / sm89. The GPU tests run
// them on the H200 with the tile forced through the plan override
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

using S = DkdvTileSize;

TEST(FlashTileChoice, D64TakesTheSmallTileOnlyWhereTheDefaultDoesNotFit) {
  EXPECT_EQ(dkdv_tile_for_device(64, kSm86OptinSmem), S::kSmall);
  EXPECT_EQ(dkdv_tile_for_device(64, kSm80OptinSmem), S::kDefault);
  EXPECT_EQ(dkdv_tile_for_device(64, kSm90OptinSmem), S::kDefault);
  EXPECT_EQ(dkdv_tile_for_device(64, dkdv_max_smem_bytes<64>()), S::kDefault);
  EXPECT_EQ(dkdv_tile_for_device(64, dkdv_max_smem_bytes<64>() - 1), S::kSmall);
}

TEST(FlashTileChoice, D128TakesTheSmallTileOnSm86Only) {
  EXPECT_EQ(dkdv_tile_for_device(128, kSm86OptinSmem), S::kSmall);
  EXPECT_EQ(dkdv_tile_for_device(128, kSm80OptinSmem), S::kDefault);
  EXPECT_EQ(dkdv_tile_for_device(128, kSm90OptinSmem), S::kDefault);
  EXPECT_EQ(dkdv_tile_for_device(128, dkdv_max_smem_bytes<128>() - 1), S::kSmall);
}

TEST(FlashTileChoice, D256TakesTheSmallTileOnSm80AndTheSmallerOnSm86) {
  EXPECT_EQ(dkdv_tile_for_device(256, kSm90OptinSmem), S::kDefault);
  EXPECT_EQ(dkdv_tile_for_device(256, dkdv_max_smem_bytes<256>()), S::kDefault);
  EXPECT_EQ(dkdv_tile_for_device(256, kSm80OptinSmem), S::kSmall);
  EXPECT_EQ(dkdv_tile_for_device(256, dkdv_max_smem_bytes<256, S::kSmall>()), S::kSmall);
  EXPECT_EQ(dkdv_tile_for_device(256, dkdv_max_smem_bytes<256, S::kSmall>() - 1), S::kSmaller);
  EXPECT_EQ(dkdv_tile_for_device(256, kSm86OptinSmem), S::kSmaller);
}

// A size d has no tile for falls back to d's smallest (what the testing
// override dkdv_tile=smaller gives at d64 and d128).
TEST(FlashTileChoice, SizesClampToTheSmallestTileOfD) {
  EXPECT_EQ(smallest_dkdv_tile(128), S::kSmall);
  EXPECT_EQ(smallest_dkdv_tile(256), S::kSmaller);
  EXPECT_EQ(clamp_dkdv_tile(128, S::kSmaller), S::kSmall);
  EXPECT_EQ(clamp_dkdv_tile(128, S::kSmall), S::kSmall);
  EXPECT_EQ(clamp_dkdv_tile(256, S::kSmaller), S::kSmaller);
  EXPECT_EQ(clamp_dkdv_tile(64, S::kDefault), S::kDefault);
  EXPECT_EQ(dkdv_max_smem_bytes(128, S::kSmaller), (dkdv_max_smem_bytes<128, S::kSmall>()));
}

TEST(FlashTileChoice, TheSmallTilesFitWhereTheDefaultsDoNot) {
  if (smallest_dkdv_tile(64) != S::kDefault) {
    EXPECT_GT(dkdv_max_smem_bytes<64>(), kSm86OptinSmem);
    EXPECT_LE(dkdv_max_smem_bytes<64>(), kSm80OptinSmem);
    EXPECT_LE((dkdv_max_smem_bytes<64, S::kSmall>()), kSm86OptinSmem);
    EXPECT_EQ((DkdvTile<64, S::kSmall>::kBlockM), 64);
  }
  EXPECT_GT(dkdv_max_smem_bytes<128>(), kSm86OptinSmem);
  EXPECT_LE(dkdv_max_smem_bytes<128>(), kSm80OptinSmem);
  EXPECT_LE((dkdv_max_smem_bytes<128, S::kSmall>()), kSm86OptinSmem);
  EXPECT_GT(dkdv_max_smem_bytes<256>(), kSm80OptinSmem);
  EXPECT_LE(dkdv_max_smem_bytes<256>(), kSm90OptinSmem);
  EXPECT_GT((dkdv_max_smem_bytes<256, S::kSmall>()), kSm86OptinSmem);
  EXPECT_LE((dkdv_max_smem_bytes<256, S::kSmall>()), kSm80OptinSmem);
  EXPECT_LE((dkdv_max_smem_bytes<256, S::kSmaller>()), kSm86OptinSmem);
  // The smaller tiles keep the default's query tile (the ordered dQ's
  // counters and its postprocess count query tiles of kBlockM).
  EXPECT_EQ((DkdvTile<128, S::kSmall>::kBlockM), DkdvTile<128>::kBlockM);
  EXPECT_EQ((DkdvTile<256, S::kSmall>::kBlockM), DkdvTile<256>::kBlockM);
  EXPECT_EQ((DkdvTile<256, S::kSmaller>::kBlockM), DkdvTile<256>::kBlockM);
}

// d256's smallest tile has no separate dQ kernel beside it (that needs 128
// KB at d256), so the backward's need there is the fused dK/dV kernel's.
TEST(FlashTileChoice, D256sSmallerTileRunsOnlyTheFusedDq) {
  EXPECT_TRUE(dkdv_fused_dq_only(256, S::kSmaller));
  EXPECT_FALSE(dkdv_fused_dq_only(256, S::kSmall));
  EXPECT_FALSE(dkdv_fused_dq_only(128, S::kSmaller));
  EXPECT_GT(dq_smem_bytes<256>(), kSm86OptinSmem);
  EXPECT_EQ(backward_min_smem_bytes<256>(), (dkdv_smem_bytes<256, true, S::kSmaller>()));
  EXPECT_EQ(default_dq_strategy(256, true, 1024, S::kSmaller), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256, false, 16384, S::kSmaller), DqStrategy::kOrdered);
}

// What the backend asks of a device for the backward: its smallest tile's
// kernels. Every d runs on every sm80+ GPU.
TEST(FlashTileChoice, TheBackwardRunsWhereItsSmallestTileFits) {
  EXPECT_LE(backward_min_smem_bytes<64>(), kSm86OptinSmem);
  EXPECT_LE(backward_min_smem_bytes<128>(), kSm86OptinSmem);
  EXPECT_LE(backward_min_smem_bytes<256>(), kSm86OptinSmem);
}

// What the backend says to a device: nothing where the pass fits; where it
// does not, the pass, d and both figures.
TEST(FlashTileChoice, TheSupportMessageNamesThePassAndBothFigures) {
  for (int d : {64, 128, 256}) {
    EXPECT_EQ(why_too_little_smem(d, /*backward=*/false, kSm86OptinSmem), "");
    EXPECT_EQ(why_too_little_smem(d, /*backward=*/true, kSm86OptinSmem), "");
    EXPECT_EQ(why_too_little_smem(d, /*backward=*/true, kSm80OptinSmem), "");
    EXPECT_EQ(why_too_little_smem(d, /*backward=*/true, kSm90OptinSmem), "");
  }
  // Devices below every sm80+ GPU's limit.
  EXPECT_EQ(why_too_little_smem(256, true, 64 * kKB),
            "not supported: cuda-flash's backward at d=256 needs 97 KB of shared memory per "
            "block, the device allows 64 KB");
  const std::string forward = why_too_little_smem(256, false, 48 * kKB);
  EXPECT_EQ(forward,
            "not supported: cuda-flash's forward at d=256 needs 96 KB of shared memory per "
            "block, the device allows 48 KB");
}

// The dK/dV grid counts key tiles of the tile that runs.
TEST(FlashTileChoice, TheGridFollowsTheKeyTile) {
  EXPECT_EQ(dkdv_key_tile(128, S::kDefault), 128);
  EXPECT_EQ(dkdv_key_tile(128, S::kSmall), 64);
  EXPECT_EQ(dkdv_key_tile(256, S::kSmall), dkdv_key_tile(256, S::kDefault));
  EXPECT_EQ(dkdv_key_tile(256, S::kSmaller), 32);
  EXPECT_EQ(dkdv_key_tile(64, S::kSmall), dkdv_key_tile(64, S::kDefault));
}

// The forward needs less than the backward at d64 and d128 and fits the sm86
// / sm89 limit at every d.
TEST(FlashTileChoice, TheForwardNeedsLessThanTheBackward) {
  EXPECT_LE(forward_smem_bytes<64>(), backward_min_smem_bytes<64>());
  EXPECT_LE(forward_smem_bytes<128>(), backward_min_smem_bytes<128>());
  EXPECT_LE(forward_smem_bytes<128>(), kSm86OptinSmem);
  EXPECT_LE(forward_smem_bytes<256>(), kSm86OptinSmem);
}

}  // namespace
