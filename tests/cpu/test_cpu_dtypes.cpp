// bf16 and f16 I/O on the cpu backend. The math stays f32 on exactly
// converted inputs, so o and dv are the f32 run's results rounded once, lse
// (always f32) is bit-identical, and dq, dk differ only through backward's
// D = do . o reading the rounded o: those get a loose bound (about 4x what is
// measured). The FlashAttention-3 rule against the oracle is the check tool's.
#include <vector>

#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

float round_to(DType dtype, float value) {
  return dtype == DType::bf16 ? bf16_to_float(float_to_bf16(value))
                              : f16_to_float(float_to_f16(value));
}

std::vector<float> rounded(DType dtype, std::vector<float> x) {
  for (float& value : x) value = round_to(dtype, value);
  return x;
}

void expect_f32_math(DType dtype, double tol) {
  const Problem p = make_problem(2, 21, 29, 4, 2, 32, true, 12, 15.0f);
  const Inputs raw = random_inputs(p, 31);
  // The inputs as the 16-bit run sees them, so both runs start equal.
  const Inputs in{p, rounded(dtype, raw.q), rounded(dtype, raw.k), rounded(dtype, raw.v),
                  rounded(dtype, raw.dout)};
  const Outputs low = run_cpu(in, dtype), f32 = run_cpu(in);
  EXPECT_TRUE(same_bits(low.o, rounded(dtype, f32.o))) << "o";
  EXPECT_TRUE(same_bits(low.dv, rounded(dtype, f32.dv))) << "dv";
  EXPECT_TRUE(same_bits(low.lse, f32.lse)) << "lse";
  EXPECT_LT(max_rel_error(low.dq, f32.dq), tol) << "dq";
  EXPECT_LT(max_rel_error(low.dk, f32.dk), tol) << "dk";
}

TEST(CpuDtypes, Bf16IsF32MathRounded) { expect_f32_math(DType::bf16, 1e-2); }

TEST(CpuDtypes, F16IsF32MathRounded) { expect_f32_math(DType::f16, 1.5e-3); }

}  // namespace
}  // namespace gqattn::test
