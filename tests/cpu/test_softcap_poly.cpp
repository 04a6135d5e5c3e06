// flash/softcap_poly.hpp, the polynomial tanh the hopper forward takes for
// small softcapped logits, against std::tanh in double: its absolute error
// over the whole range it serves (at least as good as the MUFU forms'
// 1.5e-7) and that of the backward's r = (1 - tanh) / 2, oddness and exact 0, that the error grows
// past the range (so the kernels' range test matters), and the host's ScoreArgs fields that carry
// the range and the mult-scaled coefficients to the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cuda/fused/problem_args.hpp"
#include "cuda/fused/softcap_poly.hpp"

namespace {

using gqattn::fused::kSoftcapPolyCoef;
using gqattn::fused::kSoftcapPolyMaxY;
using gqattn::fused::kSoftcapPolyTerms;
using gqattn::fused::softcap_poly_factor;
using gqattn::fused::softcap_poly_tanh;

constexpr double kMaxAbsoluteError = 1.5e-7;

double abs_error(float y) { return std::abs(double(softcap_poly_tanh(y)) - std::tanh(double(y))); }

TEST(SoftcapPoly, AbsoluteErrorOverItsRange) {
  double worst = 0.0;
  float worst_y = 0.0f;
  constexpr int kSteps = 2000000;
  for (int i = -kSteps; i <= kSteps; ++i) {
    const float y = kSoftcapPolyMaxY * float(i) / float(kSteps);
    const double e = abs_error(y);
    if (e > worst) {
      worst = e;
      worst_y = y;
    }
  }
  EXPECT_LT(worst, kMaxAbsoluteError) << "at y = " << worst_y;
  EXPECT_LT(abs_error(kSoftcapPolyMaxY), kMaxAbsoluteError);
  EXPECT_LT(abs_error(-kSoftcapPolyMaxY), kMaxAbsoluteError);
}

TEST(SoftcapPoly, OddWithExactZero) {
  EXPECT_EQ(softcap_poly_tanh(0.0f), 0.0f);
  for (float y : {1e-30f, 1e-7f, 0.01f, 0.3f, 0.625f})
    EXPECT_EQ(softcap_poly_tanh(-y), -softcap_poly_tanh(y)) << "y = " << y;
  // Relative accuracy where tanh(y) ~ y: the kernels divide nothing by it,
  // but the exponent mult tanh(y) must not lose small logits.
  for (float y : {1e-20f, 1e-6f, 1e-3f, 0.1f})
    EXPECT_NEAR(double(softcap_poly_tanh(y)) / std::tanh(double(y)), 1.0, 2.5e-7) << "y = " << y;
}

// The backward's r = 1 / (e^(2y) + 1): the same accuracy (about half the
// tanh's absolute error) over the range.
TEST(SoftcapPoly, BackwardROverItsRange) {
  double worst = 0.0;
  constexpr int kSteps = 200000;
  for (int i = -kSteps; i <= kSteps; ++i) {
    const float y = kSoftcapPolyMaxY * float(i) / float(kSteps);
    const double want = 1.0 / (std::exp(2.0 * double(y)) + 1.0);
    worst = std::max(worst, std::abs(double(gqattn::fused::softcap_poly_r(y)) - want));
  }
  EXPECT_LT(worst, 1e-7);
  EXPECT_EQ(gqattn::fused::softcap_poly_r(0.0f), 0.5f);
}

// Past the range the fit degrades: the kernels must route those scores to
// the MUFU form (softcap_poly_applies), and this shows the bound is real.
TEST(SoftcapPoly, ErrorGrowsPastTheRange) {
  EXPECT_GT(abs_error(1.0f), 1e-5);
  EXPECT_GT(abs_error(2.0f), 1e-2);
}

TEST(SoftcapPoly, ScoreArgsCarryBoundAndScaledCoefficients) {
  gqattn::Problem p;
  p.B = 1;
  p.Tq = p.Tk = 16;
  p.H = p.Hkv = 1;
  p.d = 128;
  p.softcap = 30.0f;
  const gqattn::fused::ScoreArgs s = gqattn::fused::score_args(p);
  ASSERT_TRUE(s.softcap);
  EXPECT_NEAR(s.poly_bound * s.pre, kSoftcapPolyMaxY, 1e-6f);
  for (int i = 0; i < kSoftcapPolyTerms; ++i)
    EXPECT_FLOAT_EQ(s.poly_exponent[i], kSoftcapPolyCoef[i] * s.mult) << "i = " << i;
  // The scaled factor gives mult tanh(y), the no-offset forward's exponent.
  const float y = 0.4f;
  EXPECT_NEAR(y * softcap_poly_factor(y * y, s.poly_exponent), s.mult * std::tanh(0.4), 1e-5);

  gqattn::Problem plain = p;
  plain.softcap = 0.0f;
  const gqattn::fused::ScoreArgs none = gqattn::fused::score_args(plain);
  EXPECT_FALSE(none.softcap);
  EXPECT_EQ(none.poly_bound, 0.0f);
}

}  // namespace
