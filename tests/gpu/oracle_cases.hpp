// The parameterised shape cases of the fused backends' oracle tests
// (test_flash_correctness.cpp, test_hopper_forward.cpp,
// test_hopper_backward.cpp): a named problem, dtype and layout, and how a
// gqattn::check report is printed when a case fails.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>

#include "gqattn/check.hpp"
#include "gqattn/types.hpp"

namespace gqattn::testing {

struct OracleCase {
  std::string name;
  Problem problem;
  DType dtype = DType::bf16;
  bool padded = false;  // non-packed strides (check::Config::padded_strides)
};

inline std::ostream& operator<<(std::ostream& os, const OracleCase& c) { return os << c.name; }

inline OracleCase make(const std::string& name, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                       int64_t Hkv, int64_t d, bool causal, int64_t window = 0,
                       float softcap = 0.0f, DType dtype = DType::bf16, bool padded = false) {
  OracleCase c;
  c.name = name;
  c.problem.B = B;
  c.problem.Tq = Tq;
  c.problem.Tk = Tk;
  c.problem.H = H;
  c.problem.Hkv = Hkv;
  c.problem.d = d;
  c.problem.causal = causal;
  c.problem.window = window;
  c.problem.softcap = softcap;
  c.dtype = dtype;
  c.padded = padded;
  return c;
}

// Scale 1 instead of 1/sqrt(d): logits of a few hundred. Under softcap far
// into tanh's saturation (1 - tanh^2 underflows to 0 there); without, row
// maxima that jump by tens between key tiles.
inline OracleCase large_logits(OracleCase c) {
  c.problem.scale = 1.0f;
  return c;
}

// Softcap with logits straddling the polynomial tanh's range
// (flash/softcap_poly.hpp: |logit| <= 0.625 cap, 18.75 at cap 30). The
// check's inputs (N(0.5, 1) elements) give q.k ~ N(d / 4, sqrt(1.5 d)); a
// warp tile's largest of its 2048 raw scores lies near mean + 3.5 sd (+- 0.4
// sd), so with the scale putting that at 0.625 cap some warp tiles of a
// problem take the polynomial and others the MUFU form in one run (the
// default 1/sqrt(d) keeps every tile inside, large_logits every tile
// outside).
inline OracleCase straddling_poly_range(OracleCase c) {
  const double d = double(c.problem.d);
  const double bound = 0.625 * double(c.problem.softcap);
  c.problem.scale = float(bound / (d / 4.0 + 3.5 * std::sqrt(1.5 * d)));
  return c;
}

// Every metric of a report, for a failure message.
inline std::string describe(const check::Report& r) {
  std::string out = "ran=" + std::to_string(r.ran) +
                    " deterministic=" + std::to_string(r.deterministic) +
                    (r.skipped.empty() ? "" : " skipped: " + r.skipped) +
                    (r.backward_skipped.empty() ? "" : " backward skipped: " + r.backward_skipped);
  for (const auto& m : r.metrics)
    out += "\n  " + m.name + ": error " + std::to_string(m.error) + " tolerance " +
           std::to_string(m.tolerance) + (m.pass ? " ok" : " FAIL") +
           (m.note.empty() ? "" : " (" + m.note + ")");
  return out;
}

inline std::string case_name(const ::testing::TestParamInfo<OracleCase>& param) {
  return param.param.name;
}

}  // namespace gqattn::testing
