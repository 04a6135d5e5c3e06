// cuda-hopper's split-KV forward, its host side (src/cuda/hopper/
// split_kv.hpp, checked here without a GPU): the rule (split only where the
// work tiles fill at most half the SMs, into as many splits as fill them,
// each of at least kSplitKvMinKeyTiles key tiles) and the key-tile ranges,
// which must cover a tile's key tiles exactly once, in order (forced counts:
// test_hopper_plan.cpp). The kernels: tests/gpu/test_hopper_forward.cpp.
#include <gtest/gtest.h>

#include "cuda/hopper/forward/split_kv.hpp"

namespace {

using gqattn::hopper::KeyTileRange;
using gqattn::hopper::kSplitKvMaxSplits;
using gqattn::hopper::split_key_tiles;
using gqattn::hopper::split_kv_rule;

constexpr int kSms = 132;  // an H200

TEST(HopperSplitKv, RuleFillsIdleSmsWithLongEnoughRanges) {
  EXPECT_EQ(split_kv_rule(64, 64, kSms), 2);  // B8 H32/8 decoding, packed: 64 tiles
  EXPECT_EQ(split_kv_rule(8, 64, kSms), 16);  // B8 MQA: capped at kSplitKvMaxSplits
  EXPECT_EQ(split_kv_rule(16, 64, kSms), 8);  // 8 x 16 = 128 tasks
  EXPECT_EQ(split_kv_rule(1, 8, kSms), 2);    // 8 key tiles: two ranges of 4
  EXPECT_EQ(split_kv_rule(1, 12, kSms), 3);
}

TEST(HopperSplitKv, RuleLeavesFullOrShortProblems) {
  EXPECT_EQ(split_kv_rule(67, 64, kSms), 1);   // more than half the SMs busy
  EXPECT_EQ(split_kv_rule(512, 32, kSms), 1);  // the benchmark's B16 T1k
  EXPECT_EQ(split_kv_rule(1, 7, kSms), 1);     // too few key tiles for two ranges
  EXPECT_EQ(split_kv_rule(0, 64, kSms), 1);    // no work
}

TEST(HopperSplitKv, RangesCoverEveryKeyTileOnceInOrder) {
  for (int first = 0; first < 3; ++first)
    for (int count = 0; count <= 40; ++count)
      for (int splits = 1; splits <= kSplitKvMaxSplits; ++splits) {
        const int last = first + count - 1;
        int next = first;  // the key tile the next non-empty range must start at
        for (int s = 0; s < splits; ++s) {
          const KeyTileRange r = split_key_tiles(first, last, s, splits);
          if (r.last < r.first) continue;  // empty
          ASSERT_EQ(r.first, next) << first << " " << count << " " << splits << " " << s;
          ASSERT_LE(r.last, last);
          next = r.last + 1;
        }
        ASSERT_EQ(next, count > 0 ? last + 1 : first) << first << " " << count << " " << splits;
      }
}

}  // namespace
