// Determinism of the cpu backend: the same inputs give the same bits on a
// second run, with more (b, h) tasks than threads so that scheduling varies,
// and for the oracle too.
#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

TEST(CpuDeterminism, TwoRunsSameBits) {
  const Problem p = make_problem(3, 29, 31, 8, 2, 16, true, 10, 25.0f);
  const Inputs in = random_inputs(p, 41);
  expect_same_bits(run_cpu(in), run_cpu(in));
  expect_same_bits(run_cpu(in, DType::bf16), run_cpu(in, DType::bf16));
}

TEST(CpuDeterminism, OracleTwoRunsSameBits) {
  const Problem p = make_problem(2, 9, 11, 4, 2, 8, true, 4, 5.0f);
  const Inputs in = random_inputs(p, 42);
  const Reference a = run_oracle(in), b = run_oracle(in);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

}  // namespace
}  // namespace gqattn::test
