// cuda-flash's default dQ strategy per problem (tile_sizes.hpp,
// default_dq_strategy): plain C++, so checked here without a GPU. The GPU
// tests (tests/gpu/test_flash_correctness.cpp) run both deterministic
// strategies on every case; this pins which one a call gets by default.
#include <gtest/gtest.h>

#include "cuda/flash/tile_sizes.hpp"

namespace {

using gqattn::flash::default_dq_strategy;
using gqattn::flash::DkdvTileSize;
using gqattn::flash::DqStrategy;
using gqattn::flash::kOrderedDqD256MinKeysCausal;
using gqattn::flash::kOrderedDqD256MinKeysNonCausal;
using gqattn::flash::kOrderedDqSmallD128MinKeys;
using gqattn::flash::kOrderedDqSmallD256MinKeys;

TEST(FlashDqDefault, OrderedForD64AndD128) {
  for (bool causal : {false, true})
    for (long long tk : {1LL, 1024LL, 16384LL}) {
      EXPECT_EQ(default_dq_strategy(64, causal, tk), DqStrategy::kOrdered);
      EXPECT_EQ(default_dq_strategy(128, causal, tk), DqStrategy::kOrdered);
    }
}

// d256: ordered from 2048 keys under a causal mask, from 8192 without
// (docs/decisions/flash-default-dq-strategy.md: causal T2k 205 vs 188, non-causal
// T4k a tie, T16k 246 vs 205).
TEST(FlashDqDefault, D256OrderedForLongProblems) {
  EXPECT_EQ(kOrderedDqD256MinKeysCausal, 2048);
  EXPECT_EQ(kOrderedDqD256MinKeysNonCausal, 8192);
  EXPECT_EQ(default_dq_strategy(256, true, 2048), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256, true, 16384), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256, true, 2047), DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(256, true, 1024), DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(256, false, 8192), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256, false, 16384), DqStrategy::kOrdered);
  EXPECT_EQ(default_dq_strategy(256, false, 8191), DqStrategy::kSeparate);
  EXPECT_EQ(default_dq_strategy(256, false, 4096), DqStrategy::kSeparate);
}

// The small-shared-memory dK/dV tiles (sm80 at d256, sm86 / sm89 at d64
// and d128): d64 separate; d128 ordered from 4096 keys, d256 from 2048,
// causal or not. d256's smaller tile (sm86 / sm89) has only the fused dQ:
// ordered always.
TEST(FlashDqDefault, SmallTilesOrderedForLongD128AndD256) {
  EXPECT_EQ(kOrderedDqSmallD128MinKeys, 4096);
  EXPECT_EQ(kOrderedDqSmallD256MinKeys, 2048);
  for (bool causal : {false, true}) {
    for (long long tk : {1LL, 1024LL, 16384LL})
      EXPECT_EQ(default_dq_strategy(64, causal, tk, DkdvTileSize::kSmall), DqStrategy::kSeparate);
    EXPECT_EQ(default_dq_strategy(128, causal, 4096, DkdvTileSize::kSmall), DqStrategy::kOrdered);
    EXPECT_EQ(default_dq_strategy(128, causal, 16384, DkdvTileSize::kSmall), DqStrategy::kOrdered);
    EXPECT_EQ(default_dq_strategy(128, causal, 4095, DkdvTileSize::kSmall), DqStrategy::kSeparate);
    EXPECT_EQ(default_dq_strategy(128, causal, 1024, DkdvTileSize::kSmall), DqStrategy::kSeparate);
    EXPECT_EQ(default_dq_strategy(256, causal, 2048, DkdvTileSize::kSmall), DqStrategy::kOrdered);
    EXPECT_EQ(default_dq_strategy(256, causal, 16384, DkdvTileSize::kSmall), DqStrategy::kOrdered);
    EXPECT_EQ(default_dq_strategy(256, causal, 2047, DkdvTileSize::kSmall), DqStrategy::kSeparate);
    EXPECT_EQ(default_dq_strategy(256, causal, 1024, DkdvTileSize::kSmall), DqStrategy::kSeparate);
    EXPECT_EQ(default_dq_strategy(256, causal, 1, DkdvTileSize::kSmaller), DqStrategy::kOrdered);
    EXPECT_EQ(default_dq_strategy(256, causal, 16384, DkdvTileSize::kSmaller),
              DqStrategy::kOrdered);
  }
}

TEST(FlashDqDefault, NeverAtomic) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true})
      for (long long tk : {1LL, 4096LL, 65536LL})
        for (DkdvTileSize tile :
             {DkdvTileSize::kDefault, DkdvTileSize::kSmall, DkdvTileSize::kSmaller})
          EXPECT_NE(default_dq_strategy(d, causal, tk, tile), DqStrategy::kAtomic);
}

}  // namespace
