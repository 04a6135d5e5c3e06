// The cpu-flash backend through the public API: against the f64 oracle on
// shapes that break tiled kernels (T = 1, 37, Tq != Tk both ways, windows of
// 1 and >= T, softcap with large logits, MQA, rows with no kept key, q_start,
// d in {1, 3, 32, 80, 128}, tiles of several blocks), in f32, bf16 and f16
// with strided layouts; varlen batches; bitwise determinism across runs and
// thread counts; every output element written (NaN poison); Auto choosing it
// for host tensors. f32 runs on both kernel paths: the AVX-512 kernels
// (where the CPU has them) and the portable loops every CPU runs.
//
// Bound: check::tolerance, the one rule of docs/semantics.md (twice the
// mirror's error against the oracle plus roundings of the dtype), with the
// mirror run on the same inputs in the same dtype and layout, and in f32 at
// least 1e-5, the bound every f32 CPU path of the suite is held to
// (test_mirror_oracle.cpp). The floor is needed because the backward
// recomputes P as exp(s - lse) from the stored f32 lse, as FlashAttention
// does, where the mirror recomputes the row's max and sum: lse's rounding
// (2^-24 relative, so about 1e-6 absolute at lse ~ 10) reaches P and dV,
// which then err about 1e-6 where the mirror's own error is a few 1e-7.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "cpu/cpu_flash_paths.hpp"
#include "cpu/cpu_test_util.hpp"
#include "gqattn/check.hpp"

namespace gqattn::test {
namespace {

float round_to(DType dtype, float value) {
  return dtype == DType::bf16 ? bf16_to_float(float_to_bf16(value))
                              : f16_to_float(float_to_f16(value));
}

Inputs rounded(DType dtype, Inputs in) {
  if (dtype == DType::f32) return in;
  for (std::vector<float>* x : {&in.q, &in.k, &in.v, &in.dout})
    for (float& value : *x) value = round_to(dtype, value);
  return in;
}

// cpu-flash against the oracle, within check::tolerance of the mirror's error.
void expect_within_rule(const Problem& p, DType dtype, Layout layout, uint64_t seed) {
  const Inputs in = rounded(dtype, random_inputs(p, seed));
  const Reference ref = run_oracle(in);
  const Outputs mirror = run_on(Backend::Cpu, in, dtype, layout);
  const Outputs got = run_on(Backend::CpuFlash, in, dtype, layout);
  const auto expect = [&](const char* name, const std::vector<float>& x,
                          const std::vector<float>& m, const std::vector<double>& r) {
    double tol = check::tolerance(dtype, name, max_rel_error(m, r));
    if (dtype == DType::f32) tol = std::max(tol, 1e-5);
    EXPECT_LE(max_rel_error(x, r), tol) << name;
  };
  expect("o", got.o, mirror.o, ref.o);
  expect("lse", got.lse, mirror.lse, ref.lse);
  expect("dq", got.dq, mirror.dq, ref.dq);
  expect("dk", got.dk, mirror.dk, ref.dk);
  expect("dv", got.dv, mirror.dv, ref.dv);
}

struct Case {
  const char* name;
  Problem problem;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }
std::string case_name(const ::testing::TestParamInfo<Case>& c) { return c.param.name; }

Problem with_q_start(Problem p, int64_t q_start) {
  p.q_start = q_start;
  return p;
}

class CpuFlashOracle : public ::testing::TestWithParam<Case> {};

// The kernel paths this CPU can run: AVX-512 (where supported), portable.
std::vector<bool> avx512_paths() {
  if (cpu_flash::avx512_supported()) return {true, false};
  return {false};
}

TEST_P(CpuFlashOracle, F32WithinTolerance) {
  const Problem& p = GetParam().problem;
  for (bool avx512 : avx512_paths()) {
    SCOPED_TRACE(avx512 ? "avx512" : "portable");
    const Avx512Kernels path(avx512);
    expect_within_rule(p, DType::f32, Layout::packed, 2000 + uint64_t(p.Tq * 7 + p.Tk + p.d));
  }
}

TEST_P(CpuFlashOracle, Bf16StridedWithinTolerance) {
  const Problem& p = GetParam().problem;
  expect_within_rule(p, DType::bf16, Layout::strided, 3000 + uint64_t(p.Tq * 7 + p.Tk + p.d));
}

TEST_P(CpuFlashOracle, F16StridedWithinTolerance) {
  const Problem& p = GetParam().problem;
  expect_within_rule(p, DType::f16, Layout::strided, 4000 + uint64_t(p.Tq * 7 + p.Tk + p.d));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuFlashOracle,
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
        Case{"softcap_window_gqa_d80", make_problem(1, 33, 33, 4, 1, 80, true, 8, 30.0f)},
        Case{"blocks_causal_mqa_d128", make_problem(1, 150, 200, 4, 1, 128, true)},
        Case{"blocks_noncausal_d64", make_problem(2, 130, 70, 2, 2, 64)},
        Case{"blocks_window_d80", make_problem(1, 200, 200, 2, 1, 80, true, 70)},
        Case{"blocks_noncausal_window", make_problem(1, 140, 190, 2, 2, 32, false, 65)},
        Case{"q_start_0", with_q_start(make_problem(1, 70, 150, 2, 1, 32, true), 0)},
        Case{"q_start_negative", with_q_start(make_problem(1, 90, 80, 2, 1, 16, true), -30)},
        Case{"q_start_past_Tk", with_q_start(make_problem(1, 20, 80, 2, 2, 16, true, 7), 100)}),
    case_name);

TEST(CpuFlash, SameBitsAcrossRunsAndThreadCounts) {
  const Problem p = make_problem(2, 150, 130, 4, 2, 48, true, 0, 20.0f);
  const Inputs in = random_inputs(p, 77);
  for (bool avx512 : avx512_paths()) {
    SCOPED_TRACE(avx512 ? "avx512" : "portable");
    const Avx512Kernels path(avx512);
    const Outputs one = run_on(Backend::CpuFlash, in, DType::f32, Layout::packed, 1);
    for (int threads : {1, 2, 3, 0}) {
      SCOPED_TRACE(threads);
      expect_same_bits(one, run_on(Backend::CpuFlash, in, DType::f32, Layout::packed, threads));
    }
  }
}

// The backward runs fused when the (batch, kv head) pairs occupy every
// worker, else as three passes with a separate dQ pass (backward.cpp
// use_fused_pass): one thread takes the first, three the second, with the
// same bits, over masks whose bands start and end inside blocks, and a
// group of more heads than the fused pass holds at once.
TEST(CpuFlash, FusedAndSeparateDqGiveTheSameBits) {
  for (const Problem& p :
       {make_problem(1, 150, 130, 4, 1, 48, true, 0, 20.0f),
        make_problem(1, 100, 140, 6, 1, 32, false, 0, 15.0f),
        make_problem(1, 200, 260, 3, 1, 32, true, 70), make_problem(1, 90, 90, 2, 1, 16, false, 33),
        with_q_start(make_problem(1, 70, 150, 2, 1, 32, true), -20)}) {
    const Inputs in = random_inputs(p, 78);
    for (bool avx512 : avx512_paths()) {
      SCOPED_TRACE(avx512 ? "avx512" : "portable");
      const Avx512Kernels path(avx512);
      const Outputs fused = run_on(Backend::CpuFlash, in, DType::f32, Layout::packed, 1);
      expect_same_bits(fused, run_on(Backend::CpuFlash, in, DType::f32, Layout::packed, 3));
    }
  }
}

// A window of one key: o = v, so dS = P (dP - D) is zero only if D rounds
// exactly as the dP product; dq and dk are then exactly zero, as the
// oracle's.
TEST(CpuFlash, WindowOfOneKeyGivesZeroDqDkInF32) {
  const Inputs in = random_inputs(make_problem(1, 150, 150, 4, 2, 80, true, 1), 92);
  for (bool avx512 : avx512_paths()) {
    SCOPED_TRACE(avx512 ? "avx512" : "portable");
    const Avx512Kernels path(avx512);
    const Outputs got = run_on(Backend::CpuFlash, in, DType::f32, Layout::packed);
    EXPECT_TRUE(std::all_of(got.dq.begin(), got.dq.end(), [](float x) { return x == 0.0f; }));
    EXPECT_TRUE(std::all_of(got.dk.begin(), got.dk.end(), [](float x) { return x == 0.0f; }));
  }
}

TEST(CpuFlash, AutoPicksItForHostTensors) {
  const Problem p = make_problem(1, 128, 128, 2, 1, 64, true);
  EXPECT_EQ(explain(p, DType::f32, Device::cpu, Backend::Auto).chosen, Backend::CpuFlash);
  EXPECT_EQ(parse_backend("cpu-flash"), Backend::CpuFlash);
  EXPECT_STREQ(backend_name(Backend::CpuFlash), "cpu-flash");
}

// Varlen: a packed batch of mixed lengths (0, 1, Tq_b > Tk_b, seqused_k)
// on cpu-flash against the mirror (itself checked against the oracle per
// sequence in test_varlen.cpp), every element written.
TEST(CpuFlash, VarlenMatchesMirror) {
  const std::vector<std::pair<int, int>> lengths = {{5, 5}, {0, 3}, {1, 1},   {9, 4},
                                                    {3, 0}, {0, 0}, {70, 90}, {17, 23}};
  const std::vector<int32_t> used = {5, 2, 1, 4, 0, 0, 80, 23};
  Problem p = make_problem(1, 1, 1, 4, 2, 24, true, 40, 10.0f);
  p.varlen = true;
  p.B = int64_t(lengths.size());
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  for (const auto& [tq, tk] : lengths) {
    cu_q.push_back(cu_q.back() + tq);
    cu_k.push_back(cu_k.back() + tk);
    p.Tq = std::max<int64_t>(p.Tq, tq);
    p.Tk = std::max<int64_t>(p.Tk, tk);
  }
  const int64_t tq = cu_q.back(), tk = cu_k.back(), d = p.d;
  std::vector<float> q = random_input(tq * p.H * d, d, 5), k = random_input(tk * p.Hkv * d, d, 6),
                     v = random_input(tk * p.Hkv * d, d, 7),
                     dout = random_input(tq * p.H * d, d, 8);
  const auto off = [](const std::vector<int32_t>& x) {
    OffsetsRef r;
    r.data = x.data();
    r.size = int64_t(x.size());
    return r;
  };
  const VarlenOffsets offsets{off(cu_q), off(cu_k), off(used)};
  const auto run = [&](Backend backend) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Outputs out;
    out.o.assign(tq * p.H * d, nan);
    out.lse.assign(p.H * tq, nan);
    out.dq.assign(tq * p.H * d, nan);
    out.dk.assign(tk * p.Hkv * d, nan);
    out.dv.assign(tk * p.Hkv * d, nan);
    const auto t = [](std::vector<float>& x, int64_t rows, int64_t heads, int64_t dd) {
      return contiguous(x.data(), DType::f32, Device::cpu, rows, heads, dd);
    };
    TensorRef lse = contiguous(out.lse.data(), DType::f32, Device::cpu, p.H, tq, 1);
    lse.rank = 2;
    Options options;
    options.backend = backend;
    forward(p, offsets, t(q, tq, p.H, d), t(k, tk, p.Hkv, d), t(v, tk, p.Hkv, d),
            t(out.o, tq, p.H, d), lse, options);
    backward(p, offsets, t(q, tq, p.H, d), t(k, tk, p.Hkv, d), t(v, tk, p.Hkv, d),
             t(out.o, tq, p.H, d), lse, t(dout, tq, p.H, d), t(out.dq, tq, p.H, d),
             t(out.dk, tk, p.Hkv, d), t(out.dv, tk, p.Hkv, d), options);
    return out;
  };
  const Outputs mirror = run(Backend::Cpu), got = run(Backend::CpuFlash);
  EXPECT_FALSE(has_nan(got.o) || has_nan(got.lse) || has_nan(got.dq) || has_nan(got.dk) ||
               has_nan(got.dv));
  EXPECT_LT(max_rel_error(got.o, mirror.o), 1e-5) << "o";
  EXPECT_LT(max_rel_error(got.lse, mirror.lse), 1e-5) << "lse";
  EXPECT_LT(max_rel_error(got.dq, mirror.dq), 1e-5) << "dq";
  EXPECT_LT(max_rel_error(got.dk, mirror.dk), 1e-5) << "dk";
  EXPECT_LT(max_rel_error(got.dv, mirror.dv), 1e-5) << "dv";
}

}  // namespace
}  // namespace gqattn::test
