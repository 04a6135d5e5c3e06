// The cpu backend (f32 mirror, through the public API) against the f64
// oracle on shapes that break kernels: T = 1, T = 37, Tq != Tk both ways,
// MQA and MHA, window 1 and window >= T, softcap with large logits, rows with
// no kept key, d in {1, 3, 32, 80}. f32 bound: max|err| / max|ref| < 1e-5 for
// o, lse and every gradient.
#include <ostream>
#include <string>

#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

struct Case {
  const char* name;
  Problem problem;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

std::string case_name(const ::testing::TestParamInfo<Case>& c) { return c.param.name; }

class MirrorOracle : public ::testing::TestWithParam<Case> {};

TEST_P(MirrorOracle, F32WithinOneInHundredThousand) {
  const Problem& p = GetParam().problem;
  const Inputs in = random_inputs(p, 1000 + static_cast<uint64_t>(p.Tq * 7 + p.Tk + p.d));
  const Outputs got = run_cpu(in);
  const Reference ref = run_oracle(in);
  const double tol = 1e-5;
  EXPECT_LT(max_rel_error(got.o, ref.o), tol) << "o";
  EXPECT_LT(max_rel_error(got.lse, ref.lse), tol) << "lse";
  EXPECT_LT(max_rel_error(got.dq, ref.dq), tol) << "dq";
  EXPECT_LT(max_rel_error(got.dk, ref.dk), tol) << "dk";
  EXPECT_LT(max_rel_error(got.dv, ref.dv), tol) << "dv";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MirrorOracle,
    ::testing::Values(
        Case{"T1", make_problem(1, 1, 1, 1, 1, 32)},
        Case{"T1_causal", make_problem(2, 1, 1, 2, 1, 3, true)},
        Case{"T37_causal_gqa", make_problem(2, 37, 37, 4, 2, 32, true)},
        Case{"T37_noncausal_d80", make_problem(1, 37, 37, 2, 1, 80)},
        Case{"Tq_lt_Tk_causal_window", make_problem(1, 20, 37, 2, 2, 80, true, 5)},
        Case{"Tq_gt_Tk_causal_empty_rows", make_problem(1, 37, 20, 4, 1, 3, true)},
        Case{"Tq_gt_Tk_noncausal", make_problem(1, 37, 11, 2, 2, 32)},
        Case{"decode_Tq1", make_problem(1, 1, 37, 8, 2, 80, true)},
        Case{"Tk1_causal", make_problem(1, 37, 1, 2, 1, 32, true)},
        Case{"mha_window1", make_problem(1, 37, 37, 3, 3, 32, true, 1)},
        Case{"window_ge_T_noncausal", make_problem(1, 37, 37, 2, 1, 32, false, 50)},
        Case{"noncausal_window_d1", make_problem(2, 9, 13, 2, 1, 1, false, 3)},
        Case{"softcap_large_logits", make_problem(1, 17, 29, 4, 2, 32, true, 0, 5.0f)},
        Case{"softcap_window_gqa_d80", make_problem(1, 33, 33, 4, 1, 80, true, 8, 30.0f)}),
    case_name);

}  // namespace
}  // namespace gqattn::test
