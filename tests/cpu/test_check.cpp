// The checker (gqattn::check::run) on the CPU backend: the f32 mirror meets
// the f32 tolerance, 16-bit I/O meets the bf16/f16 rule, padded strides and
// determinism are exercised, a non-deterministic call is still checked
// against the oracle, and a refused backend is reported, not run.
#include <gtest/gtest.h>

#include <sstream>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"

namespace {

using gqattn::Backend;
using gqattn::DType;

std::string describe(const gqattn::check::Report& r) {
  std::ostringstream out;
  out << gqattn::backend_name(r.backend) << (r.ran ? "" : " skipped: " + r.skipped);
  for (const auto& m : r.metrics)
    out << "\n  " << m.name << " error " << m.error << " tol " << m.tolerance << " "
        << (m.pass ? "pass" : "FAIL") << " " << m.note;
  out << "\n  deterministic " << r.deterministic;
  return out.str();
}

gqattn::check::Config seed_like(DType dtype) {
  gqattn::check::Config c;
  c.problem.B = 2;
  c.problem.Tq = c.problem.Tk = 67;
  c.problem.H = 4;
  c.problem.Hkv = 2;
  c.problem.d = 16;
  c.problem.causal = true;
  c.problem.window = 20;
  c.problem.softcap = 30.0f;
  c.dtype = dtype;
  c.backend = Backend::Cpu;
  return c;
}

TEST(Check, CpuPassesInEveryDtype) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const auto report = gqattn::check::run(seed_like(dtype));
    EXPECT_TRUE(report.ran && report.pass) << describe(report);
    ASSERT_EQ(report.metrics.size(), 5u);
    // Inputs are random and rounded: a zero error would mean the checker
    // compared something with itself.
    if (dtype != DType::f32) {
      for (const auto& m : report.metrics) EXPECT_GT(m.error, 0.0) << m.name;
    }
  }
}

TEST(Check, PaddedStridesAndRowsWithoutKeys) {
  auto c = seed_like(DType::f32);
  c.problem.Tq = 40;
  c.problem.Tk = 23;  // causal, Tq > Tk: the first 17 query rows keep no key
  c.padded_strides = true;
  const auto report = gqattn::check::run(c);
  EXPECT_TRUE(report.ran && report.pass) << describe(report);
}

// deterministic = false reaches the backend as Options::deterministic (the
// CPU backend is deterministic either way): the outputs are still checked
// against the oracle; only the bitwise rerun is skipped.
TEST(Check, NondeterministicStillMeetsTheOracle) {
  auto c = seed_like(DType::bf16);
  c.deterministic = false;
  const auto report = gqattn::check::run(c);
  EXPECT_TRUE(report.ran && report.pass) << describe(report);
  ASSERT_EQ(report.metrics.size(), 5u);
  for (const auto& m : report.metrics) EXPECT_GT(m.error, 0.0) << m.name;
}

TEST(Check, RefusedBackendIsReportedNotRun) {
  auto c = seed_like(DType::f32);
  c.problem.d = 80;
  c.backend = Backend::CudaFlash;
  const auto report = gqattn::check::run(c);
  EXPECT_FALSE(report.ran);
  EXPECT_FALSE(report.pass);
  EXPECT_NE(report.skipped.find("cuda-flash"), std::string::npos) << report.skipped;
}

}  // namespace
