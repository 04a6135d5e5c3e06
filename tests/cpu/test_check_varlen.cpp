// The checker (gqattn::check::run) on varlen batches and query offsets
// (q_start), on the CPU backend: seeded and explicit lengths (0 and 1
// included), seqused_k, padded strides and unchecked offsets pass in every
// dtype with tolerances that stay tight (a mirror run on other offsets than
// the oracle's would inflate them); a backend given a wrong q_start, a moved
// sequence boundary or no seqused_k fails; check::layout_of draws the
// lengths from the seed and refuses lengths that do not fit.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace {

using gqattn::Backend;
using gqattn::DType;
using gqattn::Problem;
using gqattn::oracle::VarlenLayout;

std::string describe(const gqattn::check::Report& r) {
  std::ostringstream out;
  out << gqattn::backend_name(r.backend) << (r.ran ? "" : " skipped: " + r.skipped);
  for (const auto& m : r.metrics)
    out << "\n  " << m.name << " error " << m.error << " tol " << m.tolerance << " "
        << (m.pass ? "pass" : "FAIL") << " " << m.note;
  out << "\n  deterministic " << r.deterministic;
  return out.str();
}

gqattn::check::Config varlen_config(DType dtype) {
  gqattn::check::Config c;
  c.problem.B = 6;
  c.problem.Tq = 37;
  c.problem.Tk = 45;
  c.problem.H = 4;
  c.problem.Hkv = 2;
  c.problem.d = 16;
  c.problem.causal = true;
  c.problem.window = 20;
  c.problem.softcap = 30.0f;
  c.problem.varlen = true;
  c.dtype = dtype;
  c.backend = Backend::Cpu;
  return c;
}

// The f32 mirror agrees with the oracle to f32 accuracy: a bound far below
// what a mirror run on other offsets than the oracle's would give.
double tight_bound(DType dtype) { return dtype == DType::f32 ? 1e-4 : 0.05; }

void expect_pass(const gqattn::check::Config& c) {
  const auto report = gqattn::check::run(c);
  ASSERT_TRUE(report.ran) << report.skipped;
  EXPECT_TRUE(report.pass) << describe(report);
  ASSERT_EQ(report.metrics.size(), c.backward ? 5u : 2u);
  for (const auto& m : report.metrics) EXPECT_LE(m.tolerance, tight_bound(c.dtype)) << m.name;
}

TEST(CheckVarlen, SeededLengthsPassInEveryDtype) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (uint64_t seed : {1, 2, 3}) {
      auto c = varlen_config(dtype);
      c.seed = seed;
      c.varlen.draw_seqused_k = seed == 2;
      SCOPED_TRACE(std::string(gqattn::dtype_name(dtype)) + " seed " + std::to_string(seed));
      expect_pass(c);
    }
  }
}

TEST(CheckVarlen, ExplicitLengthsQStartPaddedUnchecked) {
  auto c = varlen_config(DType::f32);
  c.problem.B = 5;
  c.varlen.seqlens_q = {5, 0, 1, 17, 37};
  c.varlen.seqlens_k = {5, 3, 1, 23, 0};
  c.varlen.seqused_k = {4, 0, 1, 20, 0};
  c.padded_strides = true;
  for (const int64_t q_start : {-7, 0, 3, 50}) {
    c.problem.q_start = q_start;
    c.varlen.check_offsets = q_start != 0;
    SCOPED_TRACE("q_start " + std::to_string(q_start));
    expect_pass(c);
  }
}

TEST(CheckVarlen, EveryLengthZero) {
  auto c = varlen_config(DType::bf16);
  c.problem.B = 3;
  c.varlen.seqlens_q = {0, 0, 0};
  c.varlen.seqlens_k = {0, 2, 0};
  expect_pass(c);
  c.varlen.seqlens_k = {0, 0, 0};
  expect_pass(c);
}

TEST(CheckQStart, DenseProblemsPass) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const int64_t q_start : {-9, -1, 0, 4, 31, 60}) {
      auto c = varlen_config(dtype);
      c.problem.varlen = false;
      c.problem.B = 2;
      c.problem.Tq = 19;
      c.problem.Tk = 31;
      c.problem.q_start = q_start;
      c.padded_strides = q_start == 4;
      SCOPED_TRACE(std::string(gqattn::dtype_name(dtype)) + " q_start " + std::to_string(q_start));
      expect_pass(c);
    }
  }
}

// A backend with the bug `mislead` stands for must fail, and on the output
// the bug shows in: the check compares what it should.
void expect_fail(gqattn::check::Config c, std::function<void(Problem&, VarlenLayout&)> mislead) {
  c.mislead_backend = std::move(mislead);
  const auto report = gqattn::check::run(c);
  ASSERT_TRUE(report.ran) << report.skipped;
  EXPECT_FALSE(report.pass) << describe(report);
  bool o_failed = false;
  for (const auto& m : report.metrics) o_failed = o_failed || (m.name == "o" && !m.pass);
  EXPECT_TRUE(o_failed) << describe(report);
  // The yardstick stays the truth's: a misled backend does not widen it.
  for (const auto& m : report.metrics) EXPECT_LE(m.tolerance, tight_bound(c.dtype)) << m.name;
}

TEST(CheckMisled, DenseQStartOffByOneFails) {
  auto c = varlen_config(DType::bf16);
  c.problem.varlen = false;
  c.problem.B = 1;
  c.problem.Tq = c.problem.Tk = 24;
  expect_fail(c, [](Problem& p, VarlenLayout&) { p.q_start = p.Tk - p.Tq + 1; });
  c.problem.q_start = -3;
  expect_fail(c, [](Problem& p, VarlenLayout&) { p.q_start = -2; });
}

TEST(CheckMisled, VarlenBugsFail) {
  auto c = varlen_config(DType::bf16);
  c.problem.B = 3;
  c.varlen.seqlens_q = {9, 12, 6};
  c.varlen.seqlens_k = {20, 14, 30};
  // The dense default (top-left, 0) instead of each sequence's Tk_b - Tq_b.
  expect_fail(c, [](Problem& p, VarlenLayout&) { p.q_start = 0; });
  // A sequence boundary moved by one row (the totals stay).
  expect_fail(c, [](Problem&, VarlenLayout& l) { l.cu_seqlens_q[1] += 1; });
  expect_fail(c, [](Problem&, VarlenLayout& l) { l.cu_seqlens_k[2] -= 1; });
  // seqused_k ignored.
  c.varlen.seqused_k = {11, 14, 3};
  expect_fail(c, [](Problem&, VarlenLayout& l) { l.seqused_k.clear(); });
}

TEST(CheckLayout, DrawnFromTheSeedWithEdgeLengths) {
  auto c = varlen_config(DType::f32);
  c.problem.B = 8;
  c.varlen.draw_seqused_k = true;
  std::set<int32_t> lengths;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    c.seed = seed;
    const VarlenLayout a = gqattn::check::layout_of(c);
    const VarlenLayout b = gqattn::check::layout_of(c);
    EXPECT_EQ(a.cu_seqlens_q, b.cu_seqlens_q);
    EXPECT_EQ(a.cu_seqlens_k, b.cu_seqlens_k);
    EXPECT_EQ(a.seqused_k, b.seqused_k);
    ASSERT_EQ(a.cu_seqlens_q.size(), 9u);
    ASSERT_EQ(a.seqused_k.size(), 8u);
    for (std::size_t i = 0; i < 8; ++i) {
      const int32_t tq = a.cu_seqlens_q[i + 1] - a.cu_seqlens_q[i];
      const int32_t tk = a.cu_seqlens_k[i + 1] - a.cu_seqlens_k[i];
      EXPECT_TRUE(tq >= 0 && tq <= c.problem.Tq);
      EXPECT_TRUE(tk >= 0 && tk <= c.problem.Tk);
      EXPECT_TRUE(a.seqused_k[i] >= 0 && a.seqused_k[i] <= tk);
      lengths.insert(tq);
    }
  }
  EXPECT_TRUE(lengths.count(0) && lengths.count(1) && lengths.count(int32_t(c.problem.Tq)));
}

TEST(CheckLayout, RefusesLengthsThatDoNotFit) {
  auto c = varlen_config(DType::f32);
  c.problem.B = 2;
  c.varlen.seqlens_q = {1, 2};
  c.varlen.seqlens_k = {3};
  EXPECT_THROW(gqattn::check::layout_of(c), gqattn::Error);  // count
  c.varlen.seqlens_k = {3, 46};
  EXPECT_THROW(gqattn::check::layout_of(c), gqattn::Error);  // past Tk
  c.varlen.seqlens_k = {3, 4};
  c.varlen.seqused_k = {4, 0};
  EXPECT_THROW(gqattn::check::layout_of(c), gqattn::Error);  // past its keys
  c.varlen.seqused_k = {3, 0};
  EXPECT_NO_THROW(gqattn::check::layout_of(c));
  c.varlen.seqlens_k.clear();
  EXPECT_THROW(gqattn::check::layout_of(c), gqattn::Error);  // one list without the other
}

}  // namespace
