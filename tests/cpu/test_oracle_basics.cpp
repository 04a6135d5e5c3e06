// The f64 oracle on cases small enough to know by hand: the mask predicate
// rule by rule, one key (o = v, lse = s), two keys (softmax of two logits)
// and rows with no kept key (o = 0, lse = -inf, zero gradients).
#include <cmath>
#include <vector>

#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

TEST(OracleKept, CausalAlignsQueriesToTheEndOfTheKeys) {
  // Tq = 2 queries over Tk = 4 keys sit at positions 2 and 3.
  const Problem p = make_problem(1, 2, 4, 1, 1, 1, /*causal=*/true);
  EXPECT_TRUE(oracle::kept(p, 0, 0));
  EXPECT_TRUE(oracle::kept(p, 0, 2));
  EXPECT_FALSE(oracle::kept(p, 0, 3));
  EXPECT_TRUE(oracle::kept(p, 1, 3));
  EXPECT_FALSE(oracle::kept(p, 1, 4));   // out of range
  EXPECT_FALSE(oracle::kept(p, 1, -1));  // out of range
}

TEST(OracleKept, WindowCountsKeysSelfIncluded) {
  const Problem p = make_problem(1, 5, 5, 1, 1, 1, /*causal=*/true, /*window=*/2);
  EXPECT_TRUE(oracle::kept(p, 3, 3));
  EXPECT_TRUE(oracle::kept(p, 3, 2));
  EXPECT_FALSE(oracle::kept(p, 3, 1));
  EXPECT_FALSE(oracle::kept(p, 3, 4));
  const Problem one = make_problem(1, 5, 5, 1, 1, 1, /*causal=*/true, /*window=*/1);
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(oracle::kept(one, 2, j), j == 2);
}

TEST(OracleKept, WindowWithoutCausalKeepsEveryLaterKey) {
  const Problem p = make_problem(1, 4, 4, 1, 1, 1, /*causal=*/false, /*window=*/2);
  EXPECT_FALSE(oracle::kept(p, 2, 0));
  EXPECT_TRUE(oracle::kept(p, 2, 1));
  EXPECT_TRUE(oracle::kept(p, 2, 3));
}

TEST(OracleKept, CausalQueriesBeforeEveryKeyKeepNothing) {
  const Problem p = make_problem(1, 5, 2, 1, 1, 1, /*causal=*/true);  // off = -3
  for (int64_t j = 0; j < 2; ++j) {
    EXPECT_FALSE(oracle::kept(p, 0, j));
    EXPECT_FALSE(oracle::kept(p, 2, j));
  }
  EXPECT_TRUE(oracle::kept(p, 3, 0));
  EXPECT_FALSE(oracle::kept(p, 3, 1));
}

TEST(OracleForward, OneKeyGivesItsValue) {
  Problem p = make_problem(1, 1, 1, 1, 1, 2);
  p.scale = 0.5f;
  const std::vector<double> q{1.0, 2.0}, k{3.0, -1.0}, v{0.25, -7.0};
  const oracle::ForwardResult r = oracle::forward(p, q, k, v);
  EXPECT_EQ(r.o, v);
  EXPECT_DOUBLE_EQ(r.lse[0], 0.5 * (3.0 - 2.0));
}

TEST(OracleForward, TwoKeysAreASoftmax) {
  Problem p = make_problem(1, 1, 2, 1, 1, 1, false, 0, /*softcap=*/2.0f);
  p.scale = 1.0f;
  const std::vector<double> q{1.0}, k{3.0, -1.0}, v{10.0, 20.0};
  const double s0 = 2.0 * std::tanh(1.5), s1 = 2.0 * std::tanh(-0.5);
  const double p0 = 1.0 / (1.0 + std::exp(s1 - s0));
  const oracle::ForwardResult r = oracle::forward(p, q, k, v);
  EXPECT_NEAR(r.o[0], 10.0 * p0 + 20.0 * (1.0 - p0), 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(s0) + std::exp(s1)), 1e-12);
}

TEST(OracleForward, RowsWithNoKeptKeyAreZeroWithMinusInfLse) {
  const Problem p = make_problem(1, 4, 2, 2, 1, 3, /*causal=*/true);  // rows 0, 1 keep nothing
  const Inputs in = random_inputs(p, 11);
  const Reference ref = run_oracle(in);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 4; ++i) {
      const bool empty = i < 2;
      EXPECT_EQ(std::isinf(ref.lse[h * 4 + i]) && ref.lse[h * 4 + i] < 0, empty);
      for (int64_t x = 0; x < 3; ++x) {
        const std::size_t n = static_cast<std::size_t>((i * 2 + h) * 3 + x);
        if (empty) {
          EXPECT_EQ(ref.o[n], 0.0);
          EXPECT_EQ(ref.dq[n], 0.0);
        } else {
          EXPECT_NE(ref.o[n], 0.0);
        }
      }
    }
  }
  for (double x : ref.dk) EXPECT_TRUE(std::isfinite(x));
  for (double x : ref.dv) EXPECT_TRUE(std::isfinite(x));
}

TEST(OracleForward, RejectsWrongSizes) {
  const Problem p = make_problem(1, 2, 2, 1, 1, 2);
  const std::vector<double> ok(4, 1.0), bad(3, 1.0);
  EXPECT_THROW(oracle::forward(p, bad, ok, ok), Error);
  EXPECT_THROW(oracle::backward(p, ok, ok, ok, bad), Error);
}

}  // namespace
}  // namespace gqattn::test
