// The oracle's gradients against central finite differences of its own
// forward, in f64, through the scalar loss L = sum(o * g) with g random (so
// dL/do = g). Small problems cover GQA, causal, window, softcap, Tq < Tk and
// Tq > Tk (rows with no kept key).
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

// Inputs q, k, v in that order.
using QKV = std::array<std::vector<double>, 3>;

double loss(const Problem& p, const QKV& x, const std::vector<double>& g) {
  const std::vector<double> o = oracle::forward(p, x[0], x[1], x[2]).o;
  double L = 0.0;
  for (std::size_t n = 0; n < o.size(); ++n) L += o[n] * g[n];
  return L;
}

// max |central difference - analytic| / max |analytic| over input `which`.
double fd_error(const Problem& p, QKV x, const std::vector<double>& g, int which,
                const std::vector<double>& analytic) {
  const double eps = 1e-6;
  double err = 0.0, scale = 0.0;
  std::vector<double>& wrt = x[static_cast<std::size_t>(which)];
  for (std::size_t n = 0; n < wrt.size(); ++n) {
    const double keep = wrt[n];
    wrt[n] = keep + eps;
    const double up = loss(p, x, g);
    wrt[n] = keep - eps;
    const double down = loss(p, x, g);
    wrt[n] = keep;
    err = std::max(err, std::fabs((up - down) / (2.0 * eps) - analytic[n]));
    scale = std::max(scale, std::fabs(analytic[n]));
  }
  EXPECT_GT(scale, 0.0) << "a gradient that is all zero checks nothing";
  return err / scale;
}

void check_gradients(const Problem& p, uint64_t seed) {
  const int64_t nq = p.B * p.Tq * p.H * p.d, nk = p.B * p.Tk * p.Hkv * p.d;
  const QKV x{to_double(random_input(nq, p.d, seed)), to_double(random_input(nk, p.d, seed + 1)),
              to_double(random_input(nk, p.d, seed + 2))};
  const std::vector<double> g = to_double(random_input(nq, p.d, seed + 3));
  const oracle::Gradients grads = oracle::backward(p, x[0], x[1], x[2], g);
  // Central differences in f64 with eps = 1e-6 are good to about 1e-9.
  const double tol = 1e-6;
  EXPECT_LT(fd_error(p, x, g, 0, grads.dq), tol) << "dq";
  EXPECT_LT(fd_error(p, x, g, 1, grads.dk), tol) << "dk";
  EXPECT_LT(fd_error(p, x, g, 2, grads.dv), tol) << "dv";
}

TEST(OracleGradients, GqaCausalWindowSoftcap) {
  // Tq < Tk: queries sit at positions 2..4.
  check_gradients(make_problem(1, 3, 5, 4, 2, 3, /*causal=*/true, /*window=*/2, /*softcap=*/2.0f),
                  101);
}

TEST(OracleGradients, MoreQueriesThanKeysWithEmptyRows) {
  check_gradients(make_problem(1, 5, 3, 2, 1, 2, /*causal=*/true), 202);
}

TEST(OracleGradients, NonCausalWindowSoftcapBatched) {
  check_gradients(make_problem(2, 4, 4, 2, 2, 3, /*causal=*/false, /*window=*/2, /*softcap=*/1.5f),
                  303);
}

TEST(OracleGradients, PlainMultiHead) { check_gradients(make_problem(1, 3, 3, 2, 2, 4), 404); }

}  // namespace
}  // namespace gqattn::test
