// cuda-hopper's choice of packed GQA in the forward (src/cuda/hopper/
// pack_gqa.hpp, host code, so it is checked here, without a GPU): packed
// exactly where a head's queries leave a tile part empty and packing needs
// fewer work tiles, for power-of-two groups that divide a warpgroup's rows.
// The packed kernels themselves: tests/gpu/test_hopper_forward.cpp.
#include <gtest/gtest.h>

#include "cuda/hopper/forward/pack_gqa.hpp"

namespace {

using gqattn::hopper::pack_gqa_shift;

TEST(HopperPackGqa, PacksShortQueriesOfPowerOfTwoGroups) {
  EXPECT_EQ(pack_gqa_shift(128, 1, 32, 8), 2);   // decoding, G = 4
  EXPECT_EQ(pack_gqa_shift(128, 1, 32, 1), 5);   // multi-query, G = 32
  EXPECT_EQ(pack_gqa_shift(128, 1, 64, 1), 6);   // G = 64, the largest
  EXPECT_EQ(pack_gqa_shift(128, 16, 16, 8), 1);  // G = 2
  EXPECT_EQ(pack_gqa_shift(192, 47, 32, 8), 2);  // tall d64 tile: 188 rows in one tile
  EXPECT_EQ(pack_gqa_shift(128, 96, 32, 8), 2);  // 384 rows: 3 tiles instead of 4
}

TEST(HopperPackGqa, LeavesProblemsItDoesNotHelp) {
  EXPECT_EQ(pack_gqa_shift(128, 1, 8, 8), 0);      // MHA: nothing to pack
  EXPECT_EQ(pack_gqa_shift(128, 1, 24, 8), 0);     // G = 3: not a power of two
  EXPECT_EQ(pack_gqa_shift(128, 1, 128, 1), 0);    // G = 128 > 64 rows per warpgroup
  EXPECT_EQ(pack_gqa_shift(128, 128, 32, 8), 0);   // a head's queries fill the tile
  EXPECT_EQ(pack_gqa_shift(128, 4096, 32, 8), 0);  // long problems keep multicast
  EXPECT_EQ(pack_gqa_shift(128, 100, 32, 8), 0);   // 400 rows: 4 tiles either way
  EXPECT_EQ(pack_gqa_shift(128, 65, 4, 2), 0);     // 130 rows: 2 tiles either way
  EXPECT_EQ(pack_gqa_shift(128, 0, 32, 8), 0);     // no queries, no tiles
  EXPECT_EQ(pack_gqa_shift(128, 1, 32, 0), 0);     // malformed heads (validated elsewhere)
  EXPECT_EQ(pack_gqa_shift(128, 1, 30, 8), 0);     // H not a multiple of Hkv
}

}  // namespace
