// cuda-hopper's split-KV forward, its host side (src/cuda/hopper/
// split_kv.hpp, checked here without a GPU): the rule (split only where the
// work tiles fill at most half the SMs, into as many splits as fill them,
// each of at least kSplitKvMinKeyTiles key tiles), GQATTN_HOPPER_SPLIT_KV
// and its errors, and the key-tile ranges, which must cover a tile's key
// tiles exactly once, in order. The kernels: tests/gpu/test_hopper_forward.cpp.
#include <gtest/gtest.h>

#include <string>

#include "cuda/hopper/forward/split_kv.hpp"
#include "gqattn/error.hpp"
#include "scoped_env.hpp"

namespace {

using gqattn::hopper::KeyTileRange;
using gqattn::hopper::kSplitKv;
using gqattn::hopper::kSplitKvMaxSplits;
using gqattn::hopper::split_key_tiles;
using gqattn::hopper::split_kv_count;
using gqattn::hopper::split_kv_rule;

constexpr int kSms = 132;  // an H200

TEST(HopperSplitKv, RuleFillsIdleSmsWithLongEnoughRanges) {
  if (!kSplitKv) GTEST_SKIP() << "split_kv.hpp kSplitKv is off";
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

TEST(HopperSplitKv, SwitchForcesACountAndRejectsOthers) {
  {
    const gqattn::test::ScopedEnv unset("GQATTN_HOPPER_SPLIT_KV", nullptr);
    EXPECT_EQ(split_kv_count(8, 64, kSms), split_kv_rule(8, 64, kSms));
  }
  {
    const gqattn::test::ScopedEnv three("GQATTN_HOPPER_SPLIT_KV", "3");
    EXPECT_EQ(split_kv_count(1000, 1, kSms), 3);
  }
  for (const char* bad : {"0", "17", "two", "3x", "-1"}) {
    const gqattn::test::ScopedEnv env("GQATTN_HOPPER_SPLIT_KV", bad);
    try {
      split_kv_count(8, 64, kSms);
      FAIL() << "GQATTN_HOPPER_SPLIT_KV=" << bad << " was accepted";
    } catch (const gqattn::Error& e) {
      EXPECT_EQ(e.argument(), std::string("GQATTN_HOPPER_SPLIT_KV = '") + bad + "'");
      EXPECT_NE(std::string(e.what()).find("from 1 to " + std::to_string(kSplitKvMaxSplits)),
                std::string::npos)
          << e.what();
    }
  }
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
