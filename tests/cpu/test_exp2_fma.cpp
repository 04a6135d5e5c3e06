// fused::exp2_fma (src/cuda/flash/exp2_fma.hpp), the exponential on the FMA
// pipe that the hopper forward uses for a share of P, against std::exp2 in
// double: its relative error over every exponent the softmax passes (a
// dense sweep and every integer and half-integer, where the rounding of j
// switches), exact +0 for masked scores (-inf) and below -127, and exact
// powers of two at the integers, where f = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda/fused/exp2_fma.hpp"

namespace {

using gqattn::fused::exp2_fma;

constexpr double kMaxRelativeError = 7.5e-5;

double relative_error(float x) {
  const double want = std::exp2(double(x));
  return std::abs(double(exp2_fma(x)) - want) / want;
}

TEST(Exp2Fma, RelativeErrorOverTheSoftmaxRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  // [-126, 80]: the running-max softmax's exponents are <= 0, the
  // no-row-max mode's at most kMaxUnshiftedExponent (< 80).
  for (int i = 0; i <= 2060000; ++i) {
    const float x = -126.0f + float(i) * 1e-4f;
    const double e = relative_error(x);
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  }
  EXPECT_LT(worst, kMaxRelativeError) << "at x = " << worst_x;
  // It is a polynomial, not exact: a test that cannot tell would say 0.
  EXPECT_GT(worst, 1e-6);
}

TEST(Exp2Fma, RoundingBoundaries) {
  for (int j = -125; j <= 100; ++j)
    for (float offset : {-0.5f, 0.5f, std::nextafter(0.5f, 0.0f), -std::nextafter(0.5f, 0.0f)}) {
      const float x = float(j) + offset;
      EXPECT_LT(relative_error(x), kMaxRelativeError) << "x = " << x;
    }
}

TEST(Exp2Fma, MaskedAndTinyExponentsGiveExactZero) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {-inf, -1e30f, -1000.0f, -128.0f, -127.0f, -126.75f}) {
    const float y = exp2_fma(x);
    EXPECT_EQ(y, 0.0f) << "x = " << x;
    EXPECT_FALSE(std::signbit(y)) << "x = " << x;
  }
  // Just above -127 the result may be a subnormal, never negative or NaN.
  for (float x = -126.99f; x < -126.0f; x += 0.01f) {
    const float y = exp2_fma(x);
    EXPECT_GE(y, 0.0f) << "x = " << x;
    EXPECT_LT(y, std::ldexp(1.0f, -125)) << "x = " << x;
  }
}

TEST(Exp2Fma, IntegersGiveTheirPowerTimesTheConstantTerm) {
  // f = 0 leaves the polynomial's constant term, c0 = 1 - 7.2e-5.
  for (int j = -126; j <= 100; ++j) {
    const float y = exp2_fma(float(j));
    EXPECT_EQ(y, gqattn::fused::kExp2FmaC0 * std::ldexp(1.0f, j)) << "j = " << j;
  }
}

}  // namespace
