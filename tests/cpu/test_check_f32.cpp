// The f32 tolerance of gqattn::check (docs/semantics.md): f32 is
// judged like 16-bit I/O, by 2 x the f32 mirror's error against the f64
// oracle + one f32 rounding, not by a fixed 1e-5 that the seed's own f32
// algorithm exceeds on long rows (dq at T = 2048).
#include <gtest/gtest.h>

#include "gqattn/check.hpp"

namespace {

using gqattn::DType;

TEST(CheckF32, ToleranceRule) {
  EXPECT_DOUBLE_EQ(gqattn::check::tolerance(DType::f32, "dq", 1e-5), 2e-5 + 1.0 / 16777216.0);
  EXPECT_DOUBLE_EQ(gqattn::check::tolerance(DType::f32, "lse", 0.0), 1.0 / 16777216.0);
  EXPECT_DOUBLE_EQ(gqattn::check::tolerance(DType::bf16, "lse", 1e-3), 2e-3 + 1.0 / 256.0);
  EXPECT_DOUBLE_EQ(gqattn::check::tolerance(DType::bf16, "dv", 1e-3), 2e-3 + 2.0 / 256.0);
  EXPECT_DOUBLE_EQ(gqattn::check::tolerance(DType::f16, "o", 0.0), 2.0 / 2048.0);
}

// The seed's algorithm in f32 (the CPU mirror) passes its own check on a long
// row; the fixed 1e-5 of before failed dq here.
TEST(CheckF32, LongRowsPass) {
  gqattn::check::Config c;
  c.problem.B = 1;
  c.problem.Tq = c.problem.Tk = 2048;
  c.problem.H = c.problem.Hkv = 1;
  c.problem.d = 64;
  c.dtype = DType::f32;
  c.backend = gqattn::Backend::Cpu;
  c.seed = 3;
  c.determinism = false;
  const gqattn::check::Report r = gqattn::check::run(c);
  ASSERT_TRUE(r.ran) << r.skipped;
  for (const auto& m : r.metrics) {
    EXPECT_TRUE(m.pass) << m.name << ": " << m.error << " > " << m.tolerance << " " << m.note;
    EXPECT_LE(m.tolerance, 1e-3) << m.name;  // still a tight bound
  }
}

}  // namespace
