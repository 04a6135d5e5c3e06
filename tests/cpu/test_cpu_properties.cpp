// Properties of the semantics the cpu backend must show, through the public
// API: a window >= Tk is no window (bitwise), a huge softcap is almost no
// softcap, GQA equals MHA with K/V repeated per group, causal row 0 is v_0,
// rows with no kept key give o = 0, lse = -inf, zero dq and no NaN.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

TEST(CpuProperties, WindowAtLeastTkIsNoWindow) {
  for (bool causal : {false, true}) {
    const Problem p = make_problem(2, 13, 21, 4, 2, 8, causal);
    const Inputs in = random_inputs(p, 7);
    const Outputs none = run_cpu(in);
    for (int64_t window : {p.Tk, p.Tk + 5}) {
      Inputs windowed = in;
      windowed.problem.window = window;
      expect_same_bits(run_cpu(windowed), none);
    }
  }
}

TEST(CpuProperties, HugeSoftcapApproachesNoSoftcap) {
  const Problem p = make_problem(1, 19, 19, 2, 1, 16, true);
  const Inputs in = random_inputs(p, 8);
  Inputs capped = in;
  capped.problem.softcap = 1e6f;
  const Outputs a = run_cpu(in), b = run_cpu(capped);
  // tanh(x) = x (1 - x^2 / 3) with x <= 1e-4 here: the cap moves a logit by
  // a few ulps at most (measured: 2e-7).
  const double tol = 1e-6;
  EXPECT_LT(max_rel_error(b.o, a.o), tol);
  EXPECT_LT(max_rel_error(b.lse, a.lse), tol);
  EXPECT_LT(max_rel_error(b.dq, a.dq), tol);
  EXPECT_LT(max_rel_error(b.dk, a.dk), tol);
  EXPECT_LT(max_rel_error(b.dv, a.dv), tol);
}

TEST(CpuProperties, GqaEqualsMhaWithRepeatedKv) {
  const int64_t B = 2, Tq = 11, Tk = 15, H = 6, Hkv = 2, d = 8, rep = H / Hkv;
  const Problem gqa = make_problem(B, Tq, Tk, H, Hkv, d, true, 6, 10.0f);
  const Inputs in = random_inputs(gqa, 9);
  Inputs mha = in;
  mha.problem.Hkv = H;
  mha.k.assign(B * Tk * H * d, 0.0f);
  mha.v.assign(B * Tk * H * d, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Tk; ++j)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < d; ++x) {
          const int64_t from = ((b * Tk + j) * Hkv + h / rep) * d + x;
          const int64_t to = ((b * Tk + j) * H + h) * d + x;
          mha.k[to] = in.k[from];
          mha.v[to] = in.v[from];
        }
  const Outputs g = run_cpu(in), m = run_cpu(mha);
  // Per query head the arithmetic is identical.
  EXPECT_TRUE(same_bits(g.o, m.o));
  EXPECT_TRUE(same_bits(g.lse, m.lse));
  EXPECT_TRUE(same_bits(g.dq, m.dq));
  // dk, dv of a group are the sums over its heads (in another order).
  std::vector<double> dk(in.k.size(), 0.0), dv(in.v.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Tk; ++j)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < d; ++x) {
          dk[((b * Tk + j) * Hkv + h / rep) * d + x] += m.dk[((b * Tk + j) * H + h) * d + x];
          dv[((b * Tk + j) * Hkv + h / rep) * d + x] += m.dv[((b * Tk + j) * H + h) * d + x];
        }
  EXPECT_LT(max_rel_error(g.dk, dk), 1e-6);
  EXPECT_LT(max_rel_error(g.dv, dv), 1e-6);
}

TEST(CpuProperties, CausalRowZeroIsValueZero) {
  const Problem p = make_problem(2, 9, 9, 4, 2, 8, true);
  const Inputs in = random_inputs(p, 10);
  const Outputs out = run_cpu(in);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      for (int64_t x = 0; x < p.d; ++x)
        EXPECT_EQ(out.o[((b * p.Tq + 0) * p.H + h) * p.d + x],
                  in.v[((b * p.Tk + 0) * p.Hkv + h / 2) * p.d + x]);
      // lse of a single key is its score.
      double s = 0.0;
      for (int64_t x = 0; x < p.d; ++x)
        s += double(in.q[(b * p.Tq * p.H + h) * p.d + x]) *
             double(in.k[(b * p.Tk * p.Hkv + h / 2) * p.d + x]);
      s *= double(p.effective_scale());
      EXPECT_NEAR(out.lse[(b * p.H + h) * p.Tq], s, 1e-5 * std::max(1.0, std::fabs(s)));
    }
}

TEST(CpuProperties, RowsWithNoKeptKeyAreZero) {
  // Causal with Tq > Tk: queries 0..Tq-Tk-1 sit before every key.
  const Problem p = make_problem(2, 10, 4, 2, 1, 5, true, 0, 3.0f);
  const Inputs in = random_inputs(p, 12);
  const Outputs out = run_cpu(in);  // also fails on any NaN
  const int64_t empty_rows = p.Tq - p.Tk;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.Tq; ++i) {
        const float lse = out.lse[(b * p.H + h) * p.Tq + i];
        if (i < empty_rows) {
          EXPECT_EQ(lse, -std::numeric_limits<float>::infinity());
        } else {
          EXPECT_TRUE(std::isfinite(lse));
        }
        for (int64_t x = 0; x < p.d; ++x) {
          const int64_t n = ((b * p.Tq + i) * p.H + h) * p.d + x;
          if (i < empty_rows) {
            EXPECT_EQ(out.o[n], 0.0f);
            EXPECT_EQ(out.dq[n], 0.0f);
          }
        }
      }
  for (float x : out.dk) EXPECT_TRUE(std::isfinite(x));
  for (float x : out.dv) EXPECT_TRUE(std::isfinite(x));
}

TEST(CpuProperties, OneKeyForOneRow) {
  // Tk = 1, causal Tq = 3: rows 0 and 1 keep nothing; row 2 keeps the key with
  // P = 1, so o_2 = v_0 exactly, D_2 = dP_20 exactly, dS = 0 and only dv moves.
  const Problem p = make_problem(1, 3, 1, 1, 1, 4, true);
  const Inputs in = random_inputs(p, 13);
  const Outputs out = run_cpu(in);
  for (float x : out.dq) EXPECT_EQ(x, 0.0f);
  for (float x : out.dk) EXPECT_EQ(x, 0.0f);
  for (int64_t x = 0; x < 4; ++x) EXPECT_EQ(out.dv[x], in.dout[2 * 4 + x]);
}

}  // namespace
}  // namespace gqattn::test
