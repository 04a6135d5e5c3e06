// cuda-flash's default dQ strategy per problem (tile_sizes.hpp,
// default_dq_strategy): plain C++, so checked here without a GPU. The GPU
// tests (tests/gpu/test_flash_correctness.cpp) run both deterministic
// strategies on every case; this pins which one a call gets by default.
#include <gtest/gtest.h>

#include "cuda/flash/tile_sizes.hpp"

namespace {

using gqattn::flash::default_dq_strategy;
using gqattn::flash::DqStrategy;
using gqattn::flash::kOrderedDqD256MinKeys;

TEST(FlashDqDefault, OrderedForD64AndD128) {
  for (bool causal : {false, true})
    for (long long tk : {1LL, 1024LL, 16384LL}) {
      // d64 is separate only on its old 64-query dK/dV tile (tile_sizes.hpp).
      EXPECT_EQ(default_dq_strategy(64, causal, tk),
                gqattn::flash::kDkdvD64QueryTile128 ? DqStrategy::kOrdered : DqStrategy::kSeparate);
      EXPECT_EQ(default_dq_strategy(128, causal, tk), DqStrategy::kOrdered);
    }
}

TEST(FlashDqDefault, D256OrderedOnlyForLongCausalProblems) {
  EXPECT_EQ(default_dq_strategy(256, true, kOrderedDqD256MinKeys), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256, true, 16384), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256, true, kOrderedDqD256MinKeys - 1), DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(256, true, 1024), DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(256, false, kOrderedDqD256MinKeys), DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(256, false, 16384), DqStrategy::kSeparate);
}

// The small-shared-memory dK/dV tiles (sm80 at d256, sm86 / sm89 at d64
// and d128): separate, except d256 with at least kOrderedDqD256MinKeys
// keys, causal or not: ordered.
TEST(FlashDqDefault, SmallTilesSeparateExceptLongD256) {
  for (bool causal : {false, true}) {
    for (long long tk : {1LL, 1024LL, 16384LL}) {
      EXPECT_EQ(default_dq_strategy(64, causal, tk, /*small_smem_dkdv_tile=*/true),
                DqStrategy::kSeparate);
      EXPECT_EQ(default_dq_strategy(128, causal, tk, /*small_smem_dkdv_tile=*/true),
                DqStrategy::kSeparate);
    }
    EXPECT_EQ(default_dq_strategy(256, causal, kOrderedDqD256MinKeys, true), DqStrategy::kOrdered);
    EXPECT_EQ(default_dq_strategy(256, causal, 16384, true), DqStrategy::kOrdered);
    EXPECT_EQ(default_dq_strategy(256, causal, kOrderedDqD256MinKeys - 1, true),
              DqStrategy::kSeparate);
    EXPECT_EQ(default_dq_strategy(256, causal, 1024, true), DqStrategy::kSeparate);
  }
}

TEST(FlashDqDefault, NeverAtomic) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true})
      for (long long tk : {1LL, 4096LL, 65536LL})
        for (bool small : {false, true})
          EXPECT_NE(default_dq_strategy(d, causal, tk, small), DqStrategy::kAtomic);
}

}  // namespace
