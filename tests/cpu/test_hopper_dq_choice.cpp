// cuda-hopper's choice of dQ path (src/cuda/hopper/backward_dq_choice.hpp,
// host code, so it is checked here, without a GPU): the measured rule
// (fused under softcap and from 1536 kept keys per query row on, only for
// d <= 128) and the GQATTN_HOPPER_DQ switch, including its errors.
#include <gtest/gtest.h>

#include <string>

#include "cuda/hopper/backward/dq_choice.hpp"
#include "gqattn/error.hpp"
#include "gqattn/types.hpp"
#include "scoped_env.hpp"

namespace {

using gqattn::hopper::bwd::use_fused_dq;

gqattn::Problem problem(int64_t T, int64_t d, bool causal, int64_t window, float softcap) {
  gqattn::Problem p;
  p.B = 1;
  p.Tq = p.Tk = T;
  p.H = 8;
  p.Hkv = 2;
  p.d = d;
  p.causal = causal;
  p.window = window;
  p.softcap = softcap;
  return p;
}

// GQATTN_HOPPER_DQ = `value` (null: unset) for the scope.
class DqSwitch : public gqattn::test::ScopedEnv {
 public:
  explicit DqSwitch(const char* value) : ScopedEnv("GQATTN_HOPPER_DQ", value) {}
};

TEST(HopperDqChoice, RuleFollowsKeysPerRowAndSoftcap) {
  const DqSwitch unset(nullptr);
  EXPECT_TRUE(use_fused_dq(problem(3072, 128, true, 0, 0.0f)));   // 1536.5 keys per row
  EXPECT_FALSE(use_fused_dq(problem(3070, 128, true, 0, 0.0f)));  // 1535.5
  EXPECT_TRUE(use_fused_dq(problem(4096, 128, true, 0, 0.0f)));
  EXPECT_TRUE(use_fused_dq(problem(4096, 128, false, 0, 0.0f)));  // 4096
  EXPECT_TRUE(use_fused_dq(problem(2048, 64, false, 0, 0.0f)));   // 2048
  EXPECT_FALSE(use_fused_dq(problem(1024, 128, true, 0, 0.0f)));  // 512.5
  EXPECT_FALSE(use_fused_dq(problem(16384, 128, true, 1024, 0.0f)));
  EXPECT_TRUE(use_fused_dq(problem(100, 128, true, 0, 30.0f)));  // softcap
  // d = 256 has no fused path, whatever the shape.
  EXPECT_FALSE(use_fused_dq(problem(16384, 256, true, 0, 0.0f)));
  EXPECT_FALSE(use_fused_dq(problem(100, 256, true, 0, 30.0f)));
}

TEST(HopperDqChoice, SwitchForcesEitherPath) {
  {
    const DqSwitch fused("fused");
    EXPECT_TRUE(use_fused_dq(problem(100, 64, false, 0, 0.0f)));
  }
  {
    const DqSwitch separate("separate");
    EXPECT_FALSE(use_fused_dq(problem(16384, 128, true, 0, 30.0f)));
  }
}

TEST(HopperDqChoice, SwitchErrorsNameTheSwitchAndTheRule) {
  {
    const DqSwitch fused("fused");
    try {
      use_fused_dq(problem(100, 256, true, 0, 0.0f));
      FAIL() << "fused accepted at d = 256";
    } catch (const gqattn::Error& e) {
      EXPECT_EQ(e.argument(), "GQATTN_HOPPER_DQ = fused");
      EXPECT_NE(e.rule().find("needs d <= 128 (got d=256)"), std::string::npos) << e.what();
    }
  }
  {
    const DqSwitch typo("fuse");
    try {
      use_fused_dq(problem(100, 128, true, 0, 0.0f));
      FAIL() << "an unknown value was accepted";
    } catch (const gqattn::Error& e) {
      EXPECT_EQ(e.argument(), "GQATTN_HOPPER_DQ = 'fuse'");
      EXPECT_NE(e.rule().find("must be fused or separate"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
