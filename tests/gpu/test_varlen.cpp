// Varlen batches (Problem::varlen) and query offsets (Problem::q_start) on
// the CUDA backends (cuda-unfused, cuda-flash, cuda-hopper), through the
// public API:
//   VarlenVsOracle.*   packed batches of random lengths (0 and 1 among them,
//                      Tq_b > Tk_b, a long sequence of several tiles beside
//                      short ones), causal or not, windows 1 and 64,
//                      softcap 30, GQA 8/2 and MQA, seqused_k, explicit
//                      q_start (negative, 0, past Tk), d 64/128 (one case
//                      256), bf16/f16 (and f32 on cuda-unfused). Forward (o,
//                      lse) and backward (dq, dk, dv) are judged per
//                      sequence against the f64 oracle with gqattn::check's
//                      tolerances (2 x the f32 CPU mirror's error on that
//                      sequence + the dtype's roundings); rows without keys
//                      and key rows no query reads are checked exactly (o =
//                      0, lse = -inf, dq = dk = dv = 0). Outputs start as
//                      NaN and sit between poisoned guard bytes that must
//                      stay untouched; two runs give the same bits; a
//                      sequence gives the same bits alone (a batch of one
//                      with the same max_seqlen and q_start) and in the
//                      batch.
//   VarlenOffsets.CheckedBadOffsets*    device offsets that break a rule,
//                      with Options::check_offsets, throw gqattn::Error
//                      naming the offset, and nothing is written.
//   VarlenOffsets.UncheckedOffsets*     wildly wrong device offsets
//                      (negative, past the end, decreasing, seqused_k out of
//                      range) without the check: the call returns (or a
//                      backend that reads offsets on the host refuses them)
//                      with no CUDA error and no byte written outside the
//                      outputs. Meant to run under compute-sanitizer too
//                      (--gtest_filter='*VarlenOffsets.UncheckedOffsets*').
//   VarlenUnfused.*     cuda-unfused in f32 against the CPU mirror, whose
//                      float operations it repeats (the parity reference);
//                      a varlen call under graph capture refused (it reads
//                      the offsets on the host).
//   DenseQueryOffset.*  dense problems with q_start through gqattn::check.
// A backend that refuses a case (gqattn::explain) skips it with the reason;
// one that runs it must pass. The cpu backend runs the same varlen cases as
// a check of the harness itself. Every CUDA case skips without a device.
#include <gtest/gtest.h>

#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"

#ifndef GQATTN_WITH_CUDA

TEST(VarlenVsOracle, NeedsCuda) { GTEST_SKIP() << "no CUDA device: this build has no CUDA"; }

#else

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "gqattn/check.hpp"
#include "gqattn/oracle.hpp"
#include "oracle_cases.hpp"
#include "varlen_harness.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;
namespace vl = gqattn::test::varlen;
namespace oracle = gqattn::oracle;

constexpr uint64_t kSeed = 20261205;

// ---- cases ---------------------------------------------------------------------

using Lengths = std::vector<std::pair<int32_t, int32_t> >;  // (queries, packed keys)

struct VarlenCase {
  std::string name;
  Problem base;  // heads, mask, softcap, q_start; d set per parameter
  Lengths lengths;
  std::vector<int32_t> used;  // seqused_k, or empty
  std::vector<int64_t> ds;
};

Problem heads(int64_t H, int64_t Hkv, bool causal, int64_t window = 0, float softcap = 0.0f) {
  return gqattn::make_problem(1, 1, 1, H, Hkv, 64, causal, window, softcap);
}

Problem with_q_start(Problem p, int64_t q_start) {
  p.q_start = q_start;
  return p;
}

// Lengths 0 and 1, Tq_b > Tk_b and Tq_b < Tk_b, sequences shorter and
// longer than a tile (64 to 192 rows in the fused kernels).
const Lengths kMixed = {{5, 5}, {0, 3},   {1, 1},    {9, 4},   {3, 0},
                        {0, 0}, {17, 23}, {130, 97}, {1, 200}, {64, 64}};

std::vector<VarlenCase> varlen_cases() {
  return {
      {"mixed_causal_gqa8_2", heads(8, 2, true), kMixed, {}, {64, 128}},
      {"mixed_noncausal_mqa", heads(4, 1, false), kMixed, {}, {64, 128}},
      // A sequence of several tiles (both ways) beside short ones.
      {"long_causal_gqa4_2",
       heads(4, 2, true),
       {{3, 5}, {700, 700}, {1, 1}, {0, 2}, {130, 260}, {260, 130}},
       {},
       {128}},
      {"long_noncausal_mqa", heads(4, 1, false), {{700, 650}, {2, 1}, {90, 700}}, {}, {64}},
      {"causal_window1",
       heads(2, 2, true, 1),
       {{100, 100}, {7, 30}, {30, 7}, {1, 5}, {0, 4}},
       {},
       {64, 128}},
      {"window64_softcap30",
       heads(4, 2, false, 64, 30.0f),
       {{200, 180}, {0, 7}, {64, 64}, {33, 1}, {150, 300}},
       {},
       {64, 128}},
      {"causal_window64_softcap30",
       heads(8, 2, true, 64, 30.0f),
       {{300, 300}, {5, 70}, {70, 5}, {1, 1}},
       {},
       {128}},
      // seqused_k: fewer keys used than packed (0 among them), and a
      // sequence without queries whose keys are partly used.
      {"seqused_k_causal_gqa",
       heads(8, 2, true),
       {{50, 80}, {20, 20}, {0, 10}, {33, 40}, {5, 9}, {140, 200}},
       {60, 0, 4, 40, 1, 129},
       {64, 128}},
      {"seqused_k_noncausal_window64",
       heads(4, 1, false, 64),
       {{100, 150}, {1, 3}, {64, 64}},
       {120, 3, 0},
       {64}},
      // Explicit q_start: below 0 (leading rows keep no key when causal),
      // 0 (top-left), past every sequence's keys.
      {"q_start_negative_causal",
       with_q_start(heads(4, 2, true), -20),
       {{64, 64}, {30, 100}, {1, 1}, {25, 3}, {150, 90}},
       {},
       {64, 128}},
      {"q_start_zero_causal",
       with_q_start(heads(4, 2, true), 0),
       {{50, 120}, {120, 50}, {3, 3}, {0, 5}, {1, 0}},
       {},
       {64, 128}},
      {"q_start_past_tk_causal",
       with_q_start(heads(4, 1, true), 150),
       {{40, 100}, {10, 10}, {200, 149}},
       {},
       {64}},
      {"q_start_past_tk_window64",
       with_q_start(heads(4, 2, false, 64), 150),
       {{40, 100}, {10, 10}, {100, 200}},
       {},
       {128}},
      {"q_start_negative_window64_softcap30",
       with_q_start(heads(2, 1, false, 64, 30.0f), -10),
       {{80, 120}, {2, 200}, {0, 0}},
       {},
       {64}},
      {"d256_causal_gqa4_2",
       heads(4, 2, true),
       {{129, 257}, {0, 1}, {70, 70}, {1, 3}, {90, 40}},
       {},
       {256}},
  };
}

struct Param {
  Backend backend = Backend::CudaUnfused;
  DType dtype = DType::bf16;
  VarlenCase c;
  int64_t d = 64;
};

std::string identifier(const std::string& text) {
  std::string out = text;
  for (char& ch : out)
    if (ch == '-') ch = '_';
  return out;
}

std::ostream& operator<<(std::ostream& os, const Param& p) {
  return os << gqattn::backend_name(p.backend) << " " << gqattn::dtype_name(p.dtype) << " "
            << p.c.name << " d" << p.d;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return identifier(gqattn::backend_name(p.backend)) + "_" + gqattn::dtype_name(p.dtype) + "_" +
         p.c.name + "_d" + std::to_string(p.d);
}

std::vector<DType> dtypes_of(Backend backend) {
  // f32 I/O only on the backends that take it (the fused ones refuse it).
  if (backend == Backend::CudaUnfused || backend == Backend::Cpu)
    return {DType::bf16, DType::f16, DType::f32};
  return {DType::bf16, DType::f16};
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (Backend backend :
       {Backend::CudaUnfused, Backend::CudaFlash, Backend::CudaHopper, Backend::Cpu})
    for (DType dtype : dtypes_of(backend))
      for (const VarlenCase& c : varlen_cases())
        for (int64_t d : c.ds) {
          // The cpu backend checks the harness: one dtype of each width.
          if (backend == Backend::Cpu && dtype == DType::f16) continue;
          out.push_back({backend, dtype, c, d});
        }
  return out;
}

vl::Batch batch_of(const Param& p) {
  Problem base = p.c.base;
  base.d = p.d;
  return vl::make_batch(base, p.c.lengths, p.c.used, p.dtype, kSeed);
}

// "" when the backend runs `pass` of the batch's problem here, else why not
// (no device, or the backend's own refusal).
std::string why_not(const Param& p, const Problem& problem, gqattn::Pass pass) {
  if (p.backend != Backend::Cpu) {
    const std::string why = gqattn::test::why_no_cuda_device();
    if (!why.empty()) return "no CUDA device: " + why;
  }
  const gqattn::Explanation e =
      gqattn::explain(problem, p.dtype, vl::device_of(p.backend), p.backend, pass);
  return e.supported ? "" : e.reason;
}

// ---- the per-sequence judgement ----------------------------------------------------

struct Judged {
  const char* name;
  std::vector<float> got, mirror;
  const std::vector<double>* ref;
};

// Every output of every sequence against the oracle, with the tolerance of
// check.hpp from the mirror's error on that sequence; the values the
// semantics fix exactly (rows without keys, keys no query reads) exactly.
void expect_matches_oracle(const vl::Batch& batch, const vl::RunResult& got,
                           const vl::RunResult& mirror, bool backward) {
  const Problem& p = batch.problem;
  const oracle::ForwardResult f = gqattn::oracle::forward_varlen(
      p, batch.layout, vl::widen(batch.q), vl::widen(batch.k), vl::widen(batch.v));
  oracle::Gradients g;
  if (backward)
    g = gqattn::oracle::backward_varlen(p, batch.layout, vl::widen(batch.q), vl::widen(batch.k),
                                        vl::widen(batch.v), vl::widen(batch.dout));
  std::vector<Judged> judged = {{"o", got.o_values(), mirror.o_values(), &f.o},
                                {"lse", got.lse_values(), mirror.lse_values(), &f.lse}};
  if (backward) {
    judged.push_back({"dq", got.dq_values(), mirror.dq_values(), &g.dq});
    judged.push_back({"dk", got.dk_values(), mirror.dk_values(), &g.dk});
    judged.push_back({"dv", got.dv_values(), mirror.dv_values(), &g.dv});
  }
  const int64_t H = p.H, Hkv = p.Hkv, d = p.d, total_q = batch.total_q();
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t q0 = batch.layout.cu_seqlens_q[b], tq = batch.tq(b);
    const int64_t k0 = batch.layout.cu_seqlens_k[b], kp = batch.packed_k(b), tk = batch.tk(b);
    const std::string where = "sequence " + std::to_string(b) + " (Tq_b " + std::to_string(tq) +
                              ", Tk_b " + std::to_string(tk) + ", packed keys " +
                              std::to_string(kp) + ")";
    for (const Judged& j : judged) {
      const std::string name = j.name;
      const bool query_side = name == "o" || name == "lse" || name == "dq";
      if ((query_side ? tq : kp) == 0) continue;
      const vl::Span span = name == "lse" ? vl::lse_span(q0, tq, H, total_q)
                            : query_side  ? vl::row_span(q0, tq, H, d)
                                          : vl::row_span(k0, kp, Hkv, d);
      const vl::SeqError e = vl::error_over(span, j.got, *j.ref);
      const vl::SeqError m = vl::error_over(span, j.mirror, *j.ref);
      ASSERT_TRUE(std::isfinite(m.error))
          << where << " " << name << ": the mirror failed, " << m.note;
      const double tolerance = gqattn::check::tolerance(batch.dtype, name, m.error);
      EXPECT_LE(e.error, tolerance) << where << " " << name << ": error " << e.error << " (mirror "
                                    << m.error << ") " << e.note;
    }
    // Exact values. Query rows that keep no key (the oracle's lse is -inf):
    // o = 0 and dq = 0. Key rows no query of the sequence reads (past
    // seqused_k, or all of a sequence without queries): dk = dv = 0.
    const std::vector<float>&o = judged[0].got, &lse = judged[1].got;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = q0; i < q0 + tq; ++i) {
        if (f.lse[std::size_t(h * total_q + i)] != -INFINITY) continue;
        EXPECT_EQ(lse[std::size_t(h * total_q + i)], -INFINITY) << where << " lse row " << i;
        for (int64_t x = 0; x < d; ++x) {
          const std::size_t e = std::size_t((i * H + h) * d + x);
          ASSERT_EQ(o[e], 0.0f) << where << " o of row " << i << " head " << h << " (no key)";
          if (backward) {
            ASSERT_EQ(judged[2].got[e], 0.0f)
                << where << " dq of row " << i << " head " << h << " (no key)";
          }
        }
      }
    if (!backward) continue;
    const int64_t first_unread = tq == 0 ? 0 : tk;
    for (int64_t j = k0 + first_unread; j < k0 + kp; ++j)
      for (int64_t e = j * Hkv * d; e < (j + 1) * Hkv * d; ++e) {
        ASSERT_EQ(judged[3].got[std::size_t(e)], 0.0f) << where << " dk of unread key row " << j;
        ASSERT_EQ(judged[4].got[std::size_t(e)], 0.0f) << where << " dv of unread key row " << j;
      }
  }
}

void expect_same_bits(const vl::RunResult& a, const vl::RunResult& b, const std::string& what) {
  EXPECT_TRUE(a.o.bytes == b.o.bytes) << what << ": o";
  EXPECT_TRUE(a.lse.bytes == b.lse.bytes) << what << ": lse";
  EXPECT_TRUE(a.dq.bytes == b.dq.bytes) << what << ": dq";
  EXPECT_TRUE(a.dk.bytes == b.dk.bytes) << what << ": dk";
  EXPECT_TRUE(a.dv.bytes == b.dv.bytes) << what << ": dv";
}

class VarlenVsOracle : public ::testing::TestWithParam<Param> {};

TEST_P(VarlenVsOracle, MatchesTheOraclePerSequence) {
  const Param& c = GetParam();
  const vl::Batch batch = batch_of(c);
  const std::string refused = why_not(c, batch.problem, gqattn::Pass::forward);
  if (!refused.empty()) GTEST_SKIP() << refused;
  const std::string backward_refused = why_not(c, batch.problem, gqattn::Pass::backward);

  vl::RunSpec spec;
  spec.backend = c.backend;
  spec.dtype = c.dtype;
  spec.o_rounding = c.dtype;
  spec.backward = backward_refused.empty();
  const vl::RunResult got = vl::run(batch, spec);
  EXPECT_TRUE(got.guards_intact()) << "a byte outside the outputs was written";
  const vl::RunResult again = vl::run(batch, spec);
  expect_same_bits(got, again, "a second run");
  expect_matches_oracle(batch, got, vl::run_mirror(batch), spec.backward);
  if (!spec.backward) GTEST_SKIP() << "forward checked; backward refused: " << backward_refused;
}

// Sequence b alone (a batch of one, same max_seqlen and q_start) gives the
// bits it gets inside the batch, in every output.
TEST_P(VarlenVsOracle, ASequenceGivesTheSameBitsAloneAndInTheBatch) {
  const Param& c = GetParam();
  const vl::Batch batch = batch_of(c);
  const std::string refused = why_not(c, batch.problem, gqattn::Pass::forward);
  if (!refused.empty()) GTEST_SKIP() << refused;
  vl::RunSpec spec;
  spec.backend = c.backend;
  spec.dtype = c.dtype;
  spec.o_rounding = c.dtype;
  spec.backward = why_not(c, batch.problem, gqattn::Pass::backward).empty();
  const vl::RunResult all = vl::run(batch, spec);
  const Problem& p = batch.problem;
  const std::size_t elem = gqattn::dtype_size(c.dtype);
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t q0 = batch.layout.cu_seqlens_q[b], tq = batch.tq(b);
    const int64_t k0 = batch.layout.cu_seqlens_k[b], kp = batch.packed_k(b);
    if (tq == 0 && kp == 0) continue;
    const vl::RunResult one = vl::run(vl::alone(batch, b), spec);
    const std::string where = "sequence " + std::to_string(b);
    EXPECT_TRUE(one.o.bytes == vl::byte_slice(all.o.bytes, elem, q0 * p.H * p.d, tq * p.H * p.d))
        << where << ": o";
    for (int64_t h = 0; h < p.H; ++h)
      EXPECT_TRUE(vl::byte_slice(one.lse.bytes, sizeof(float), h * tq, tq) ==
                  vl::byte_slice(all.lse.bytes, sizeof(float), h * batch.total_q() + q0, tq))
          << where << ": lse of head " << h;
    if (!spec.backward) continue;
    EXPECT_TRUE(one.dq.bytes == vl::byte_slice(all.dq.bytes, elem, q0 * p.H * p.d, tq * p.H * p.d))
        << where << ": dq";
    EXPECT_TRUE(one.dk.bytes ==
                vl::byte_slice(all.dk.bytes, elem, k0 * p.Hkv * p.d, kp * p.Hkv * p.d))
        << where << ": dk";
    EXPECT_TRUE(one.dv.bytes ==
                vl::byte_slice(all.dv.bytes, elem, k0 * p.Hkv * p.d, kp * p.Hkv * p.d))
        << where << ": dv";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenVsOracle, ::testing::ValuesIn(params()), param_name);

// max |x - ref| / max |ref| over a whole output; infinite where an
// infinity or NaN differs.
double relative_difference(const std::vector<float>& x, const std::vector<float>& ref) {
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t e = 0; e < ref.size(); ++e) {
    if (std::isnan(x[e]) || std::isnan(ref[e])) return INFINITY;
    if (std::isinf(x[e]) || std::isinf(ref[e])) {
      if (x[e] != ref[e]) return INFINITY;
      continue;
    }
    max_ref = std::max(max_ref, std::fabs(double(ref[e])));
    max_diff = std::max(max_diff, std::fabs(double(x[e]) - double(ref[e])));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

// cuda-unfused is the parity reference of the fused backends' varlen
// kernels: in f32 it runs each sequence with the CPU mirror's float
// operations in the mirror's order, so its outputs are the mirror's within
// the bounds of test_cuda_unfused.cpp (1e-6; under a softcap o 4e-6 and
// the gradients 1e-5, glibc's tanhf and CUDA's being an ulp apart on some
// inputs: o read 1.1e-6 and 1.2e-6 on an H100 with a window and softcap 30).
TEST(VarlenUnfused, F32MatchesTheCpuMirror) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const VarlenCase& c : varlen_cases()) {
    const Param p{Backend::CudaUnfused, DType::f32, c, c.ds.front()};
    const vl::Batch batch = batch_of(p);
    const std::string refused = why_not(p, batch.problem, gqattn::Pass::backward);
    if (!refused.empty()) GTEST_SKIP() << refused;
    vl::RunSpec spec;
    spec.backend = Backend::CudaUnfused;
    spec.dtype = DType::f32;
    spec.o_rounding = DType::f32;
    const vl::RunResult got = vl::run(batch, spec);
    const vl::RunResult cpu = vl::run_mirror(batch);
    const double grad_bound = c.base.softcap > 0.0f ? 1e-5 : 1e-6;
    const double o_bound = c.base.softcap > 0.0f ? 4e-6 : 1e-6;
    EXPECT_LE(relative_difference(got.o_values(), cpu.o_values()), o_bound) << c.name << ": o";
    EXPECT_LE(relative_difference(got.lse_values(), cpu.lse_values()), 1e-6) << c.name << ": lse";
    EXPECT_LE(relative_difference(got.dq_values(), cpu.dq_values()), grad_bound)
        << c.name << ": dq";
    EXPECT_LE(relative_difference(got.dk_values(), cpu.dk_values()), grad_bound)
        << c.name << ": dk";
    EXPECT_LE(relative_difference(got.dv_values(), cpu.dv_values()), 1e-6) << c.name << ": dv";
  }
}

// ---- wrong offsets ------------------------------------------------------------------

// A small batch whose offsets the tests below replace: totals 17 queries
// and 14 keys, max_seqlen_q 9, max_seqlen_k 7.
vl::Batch small_batch(int64_t d) {
  Problem base = heads(4, 2, true);
  base.d = d;
  return vl::make_batch(base, {{5, 7}, {9, 4}, {3, 3}}, {}, DType::bf16, kSeed + 1);
}

struct OffsetsParam {
  Backend backend;
  int64_t d;
};

std::string offsets_param_name(const ::testing::TestParamInfo<OffsetsParam>& info) {
  return identifier(gqattn::backend_name(info.param.backend)) + "_d" + std::to_string(info.param.d);
}

class VarlenOffsets : public ::testing::TestWithParam<OffsetsParam> {
 protected:
  // "" when the backend runs the small batch here, else why not.
  std::string why_not_here(const vl::Batch& batch, gqattn::Pass pass) const {
    Param p;
    p.backend = GetParam().backend;
    p.dtype = DType::bf16;
    return why_not(p, batch.problem, pass);
  }
};

bool all_poison(const std::vector<unsigned char>& bytes) {
  return vl::is_poison(bytes.data(), bytes.size());
}

// Offsets on the device that break one rule each, checked
// (Options::check_offsets): an Error naming the offset, nothing written.
TEST_P(VarlenOffsets, CheckedBadOffsetsAreRejectedNamingThem) {
  const vl::Batch batch = small_batch(GetParam().d);
  const std::string refused = why_not_here(batch, gqattn::Pass::forward);
  if (!refused.empty()) GTEST_SKIP() << refused;
  const bool backward = why_not_here(batch, gqattn::Pass::backward).empty();
  struct Bad {
    oracle::VarlenLayout layout;
    std::string names;  // what the message must name
  };
  const std::vector<int32_t> cu_q = batch.layout.cu_seqlens_q, cu_k = batch.layout.cu_seqlens_k;
  const std::vector<Bad> bad = {
      {{{0, 9, 5, 17}, cu_k, {}}, "cu_seqlens_q[2] = 5"},       // decreasing
      {{cu_q, {0, 7, 11, 13}, {}}, "cu_seqlens_k[B] = 13"},     // last != total_k (14)
      {{{0, 2, 12, 17}, cu_k, {}}, "cu_seqlens_q sequence 1"},  // 10 > max_seqlen_q (9)
      {{cu_q, cu_k, {7, 5, 3}}, "seqused_k[1] = 5"},            // sequence 1 has 4 keys
  };
  for (const Bad& x : bad) {
    vl::RunSpec spec;
    spec.backend = GetParam().backend;
    spec.dtype = DType::bf16;
    spec.backward = backward;
    spec.check_offsets = true;
    spec.given = &x.layout;
    spec.catch_errors = true;
    const vl::RunResult r = vl::run(batch, spec);
    EXPECT_NE(r.forward_error.find(x.names), std::string::npos)
        << "forward: expected an Error naming " << x.names << ", got '" << r.forward_error << "'";
    EXPECT_TRUE(all_poison(r.o.bytes) && all_poison(r.lse.bytes)) << x.names << ": forward wrote";
    EXPECT_TRUE(r.guards_intact()) << x.names;
    if (!backward) continue;
    EXPECT_NE(r.backward_error.find(x.names), std::string::npos)
        << "backward: expected an Error naming " << x.names << ", got '" << r.backward_error << "'";
    EXPECT_TRUE(all_poison(r.dq.bytes) && all_poison(r.dk.bytes) && all_poison(r.dv.bytes))
        << x.names << ": backward wrote";
  }
}

// Wildly wrong device offsets, unchecked: the call may compute anything
// inside the outputs (or, on a backend that reads offsets on the host,
// refuse them), but returns without a CUDA error and writes no byte
// outside them.
TEST_P(VarlenOffsets, UncheckedOffsetsStayInsideTheTensors) {
  const vl::Batch batch = small_batch(GetParam().d);
  const std::string refused = why_not_here(batch, gqattn::Pass::forward);
  if (!refused.empty()) GTEST_SKIP() << refused;
  const bool backward = why_not_here(batch, gqattn::Pass::backward).empty();
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  const std::vector<int32_t> cu_q = batch.layout.cu_seqlens_q, cu_k = batch.layout.cu_seqlens_k;
  const std::vector<std::pair<std::string, oracle::VarlenLayout> > wild = {
      {"negative", {{0, -50, 10, 17}, {0, -1000, 5, 14}, {}}},
      {"past the end", {{0, 1000, 1 << 30, 17}, {0, 514, kMax, 14}, {}}},
      {"decreasing", {{0, 12, 3, 17}, {0, 10, 2, 14}, {}}},
      {"extremes", {{5, kMax, kMin, 2}, {kMin, 0, kMax, -3}, {}}},
      {"seqused_k out of range", {cu_q, cu_k, {-7, 1 << 30, kMax}}},
      {"everything", {{0, 16, -4, kMax}, {kMax, -9, 13, 0}, {kMin, 3, kMax}}},
  };
  for (const auto& [what, layout] : wild) {
    vl::RunSpec spec;
    spec.backend = GetParam().backend;
    spec.dtype = DType::bf16;
    spec.backward = backward;
    spec.check_offsets = false;
    spec.given = &layout;
    spec.catch_errors = true;                      // a host-side refusal is allowed
    const vl::RunResult r = vl::run(batch, spec);  // synchronises: a CUDA error throws
    EXPECT_TRUE(r.o.guards_intact && r.lse.guards_intact) << what << ": forward wrote outside";
    EXPECT_TRUE(r.dq.guards_intact && r.dk.guards_intact && r.dv.guards_intact)
        << what << ": backward wrote outside";
    if (!r.forward_error.empty()) {
      EXPECT_NE(r.forward_error.find("seq"), std::string::npos) << r.forward_error;
      EXPECT_TRUE(all_poison(r.o.bytes) && all_poison(r.lse.bytes)) << what << ": refused, wrote";
    }
  }
  if (GetParam().backend != Backend::Cpu)
    gqattn::test::cuda_ok(cudaGetLastError(), "after unchecked offsets");
}

// cuda-unfused reads a varlen batch's offsets on the host (a
// synchronisation with the stream) whatever Options::check_offsets says, so
// such a call cannot be captured in a CUDA graph: under capture it throws a
// gqattn::Error naming the offsets and writes nothing, and the stream runs
// the same call uncaptured afterwards.
TEST(VarlenUnfused, RefusedUnderGraphCaptureNamingTheOffsets) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const vl::Batch batch = small_batch(64);
  const Param param{Backend::CudaUnfused, DType::bf16, {}, 64};
  const std::string refused = why_not(param, batch.problem, gqattn::Pass::forward);
  if (!refused.empty()) GTEST_SKIP() << refused;
  const Problem& p = batch.problem;
  const DType t = DType::bf16;
  const std::size_t q_bytes = std::size_t(batch.total_q() * p.H * p.d) * 2;
  const std::size_t kv_bytes = std::size_t(batch.total_k() * p.Hkv * p.d) * 2;
  const std::size_t lse_bytes = std::size_t(p.H * batch.total_q()) * sizeof(float);
  vl::GuardedBuffer q(Device::cuda, q_bytes), k(Device::cuda, kv_bytes), v(Device::cuda, kv_bytes),
      o(Device::cuda, q_bytes), lse(Device::cuda, lse_bytes);
  q.upload(vl::encode(t, batch.q));
  k.upload(vl::encode(t, batch.k));
  v.upload(vl::encode(t, batch.v));
  const vl::Int32Vector cu_q(Device::cuda, batch.layout.cu_seqlens_q);
  const vl::Int32Vector cu_k(Device::cuda, batch.layout.cu_seqlens_k);
  const gqattn::VarlenOffsets offsets{cu_q.ref(), cu_k.ref(), {}};
  gqattn::test::Stream stream;
  gqattn::Options options;
  options.backend = Backend::CudaUnfused;
  options.stream = stream.get();
  options.check_offsets = false;
  auto call = [&] {
    gqattn::forward(p, offsets, vl::packed(q, t, Device::cuda, batch.total_q(), p.H, p.d),
                    vl::packed(k, t, Device::cuda, batch.total_k(), p.Hkv, p.d),
                    vl::packed(v, t, Device::cuda, batch.total_k(), p.Hkv, p.d),
                    vl::packed(o, t, Device::cuda, batch.total_q(), p.H, p.d),
                    vl::lse_ref(lse, Device::cuda, p.H, batch.total_q()), options);
  };
  gqattn::test::device_synchronize();  // the uploads ran on the legacy stream

  gqattn::test::cuda_ok(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal),
                        "cudaStreamBeginCapture");
  std::string error;
  try {
    call();
  } catch (const gqattn::Error& e) {
    error = e.what();
  }
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(stream.get(), &graph);  // invalidated by the refused copy
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  EXPECT_NE(error.find("sequence offsets"), std::string::npos) << "got '" << error << "'";
  const vl::Output refused_o = vl::read_output(o, q_bytes);
  EXPECT_TRUE(refused_o.guards_intact && all_poison(refused_o.bytes)) << "written under capture";

  call();
  stream.synchronize();
  const vl::Output ran = vl::read_output(o, q_bytes);
  EXPECT_TRUE(ran.guards_intact);
  EXPECT_FALSE(vl::is_poison(ran.bytes.data(), 2)) << "the uncaptured call wrote nothing";
}

std::vector<OffsetsParam> offsets_params() {
  std::vector<OffsetsParam> out;
  for (Backend backend : {Backend::CudaUnfused, Backend::CudaFlash, Backend::CudaHopper})
    for (int64_t d : {64, 128}) out.push_back({backend, d});
  out.push_back({Backend::Cpu, 64});  // the harness itself (it reads every offset on the host)
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenOffsets, ::testing::ValuesIn(offsets_params()),
                         offsets_param_name);

// ---- dense q_start ------------------------------------------------------------------

struct DenseParam {
  Backend backend;
  gqattn::testing::OracleCase c;
};

std::string dense_param_name(const ::testing::TestParamInfo<DenseParam>& info) {
  return identifier(gqattn::backend_name(info.param.backend)) + "_" + info.param.c.name;
}

gqattn::testing::OracleCase q_start_case(const std::string& name, int64_t Tq, int64_t Tk, int64_t H,
                                         int64_t Hkv, int64_t d, bool causal, int64_t window,
                                         int64_t q_start, DType dtype = DType::bf16) {
  gqattn::testing::OracleCase c =
      gqattn::testing::make(name, 2, Tq, Tk, H, Hkv, d, causal, window, 0.0f, dtype);
  c.problem.q_start = q_start;
  return c;
}

std::vector<DenseParam> dense_params() {
  const DType f16 = DType::f16;
  std::vector<gqattn::testing::OracleCase> cases;
  for (int64_t d : {64, 128}) {
    const std::string D = "_d" + std::to_string(d);
    cases.push_back(q_start_case("causal_q_start_neg30" + D, 100, 200, 4, 2, d, true, 0, -30));
    cases.push_back(q_start_case("causal_q_start_0" + D, 100, 200, 4, 2, d, true, 0, 0));
    cases.push_back(q_start_case("causal_q_start_37" + D, 100, 200, 4, 1, d, true, 0, 37));
    cases.push_back(q_start_case("causal_q_start_past_tk" + D, 100, 200, 4, 2, d, true, 0, 250));
    cases.push_back(q_start_case("Tq_gt_Tk_causal_q_start_0" + D, 200, 64, 2, 2, d, true, 0, 0));
    cases.push_back(q_start_case("window64_q_start_neg10" + D, 150, 300, 4, 2, d, false, 64, -10));
    cases.push_back(q_start_case("window64_q_start_past_tk" + D, 64, 300, 4, 2, d, false, 64, 330));
    cases.push_back(
        q_start_case("causal_window64_q_start_500" + D, 300, 700, 8, 2, d, true, 64, 500, f16));
  }
  std::vector<DenseParam> out;
  for (Backend backend : {Backend::CudaUnfused, Backend::CudaFlash, Backend::CudaHopper})
    for (const auto& c : cases) out.push_back({backend, c});
  // f32 I/O, on the backend that takes it.
  out.push_back({Backend::CudaUnfused, q_start_case("f32_causal_q_start_neg7_d64", 50, 80, 2, 1, 64,
                                                    true, 0, -7, DType::f32)});
  return out;
}

class DenseQueryOffset : public ::testing::TestWithParam<DenseParam> {};

TEST_P(DenseQueryOffset, MatchesTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const DenseParam& p = GetParam();
  gqattn::check::Config config;
  config.problem = p.c.problem;
  config.dtype = p.c.dtype;
  config.backend = p.backend;
  config.seed = kSeed;
  const gqattn::check::Report report = gqattn::check::run(config);
  if (!report.ran) GTEST_SKIP() << report.skipped;
  EXPECT_TRUE(report.pass) << gqattn::testing::describe(report);
}

INSTANTIATE_TEST_SUITE_P(Cases, DenseQueryOffset, ::testing::ValuesIn(dense_params()),
                         dense_param_name);

}  // namespace

#endif  // GQATTN_WITH_CUDA
