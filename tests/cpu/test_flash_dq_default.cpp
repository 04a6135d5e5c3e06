// cuda-flash's default dQ strategy per problem (tile_sizes.hpp,
// default_dq_strategy): plain C++, so checked here without a GPU. The GPU
// tests (tests/gpu/test_flash_correctness.cpp) run both deterministic
// strategies on every case; this pins which one a call gets by default.
#include <gtest/gtest.h>

#include "cuda/flash/tile_sizes.hpp"

namespace {

using gqattn::flash::default_dq_strategy;
using gqattn::flash::DqStrategy;

TEST(FlashDqDefault, OrderedForEveryHeadDim) {
  // d64 is separate only on its old 64-query dK/dV tile (tile_sizes.hpp).
  EXPECT_EQ(default_dq_strategy(64),
            gqattn::flash::kDkdvD64QueryTile128 ? DqStrategy::kOrdered : DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(128), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256), DqStrategy::kOrdered);
}

TEST(FlashDqDefault, NeverAtomic) {
  for (int d : {64, 128, 256}) EXPECT_NE(default_dq_strategy(d), DqStrategy::kAtomic);
}

}  // namespace
