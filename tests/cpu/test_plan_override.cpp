// The plan override (src/api/plan_override.hpp), the test and benchmark
// hook that forces a fused backend's plan: its one parser (every field,
// every refusal naming the item), its round trip to text, and that a scope
// sets it for this thread only and restores what was before.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "api/plan_override.hpp"
#include "gqattn/error.hpp"

namespace {

using gqattn::detail::DkdvTileChoice;
using gqattn::detail::DqPath;
using gqattn::detail::parse_plan_override;
using gqattn::detail::plan_override;
using gqattn::detail::PlanOverride;
using gqattn::detail::ScopedPlanOverride;

TEST(PlanOverride, ParsesEveryField) {
  const PlanOverride force =
      parse_plan_override("splits=3,dq=separate,dkdv_group=0,dkdv_tile=small");
  EXPECT_EQ(force.forward_splits, 3);
  EXPECT_EQ(force.dq_path, DqPath::separate);
  EXPECT_EQ(force.dkdv_group_pairs, 0);
  EXPECT_EQ(force.dkdv_tile, DkdvTileChoice::small);
  EXPECT_TRUE(force.any());
  EXPECT_EQ(to_string(force), "splits=3,dq=separate,dkdv_group=0,dkdv_tile=small");
  EXPECT_EQ(parse_plan_override("dq=atomic").dq_path, DqPath::atomic);
  EXPECT_EQ(parse_plan_override("dq=fused").dq_path, DqPath::fused);
  EXPECT_EQ(parse_plan_override("dkdv_tile=smaller").dkdv_tile, DkdvTileChoice::smaller);
  EXPECT_FALSE(parse_plan_override("").any());
  EXPECT_EQ(to_string(PlanOverride{}), "");
}

TEST(PlanOverride, RefusesBadItemsByName) {
  for (const char* bad : {"splits=0", "splits=17", "splits=two", "splits=3x", "splits=",
                          "dq=ordered", "dkdv_group=-1", "dkdv_tile=large", "tile=wide", "dq"}) {
    try {
      parse_plan_override(std::string("splits=2,") + bad);
      FAIL() << bad << " was accepted";
    } catch (const gqattn::Error& e) {
      EXPECT_EQ(e.argument(), std::string("plan override '") + bad + "'");
    }
  }
}

TEST(PlanOverride, ScopeSetsThisThreadAndRestores) {
  EXPECT_FALSE(plan_override().any());
  {
    const ScopedPlanOverride outer(parse_plan_override("splits=2"));
    EXPECT_EQ(plan_override().forward_splits, 2);
    {
      const ScopedPlanOverride inner(parse_plan_override("dq=fused"));
      EXPECT_EQ(plan_override().forward_splits, 0);
      EXPECT_EQ(plan_override().dq_path, DqPath::fused);
    }
    EXPECT_EQ(plan_override().forward_splits, 2);
    bool other_thread_forced = true;
    std::thread other([&] { other_thread_forced = plan_override().any(); });
    other.join();
    EXPECT_FALSE(other_thread_forced);
  }
  EXPECT_FALSE(plan_override().any());
}

}  // namespace
