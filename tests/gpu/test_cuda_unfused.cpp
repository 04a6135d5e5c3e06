// cuda-unfused against the CPU backend (the f32 mirror of the seed, the same
// float operations in the same order), through the public API:
//   UnfusedSmall.*      tiny problems, also the compute-sanitizer target
//   UnfusedVsCpuF32.*   the shapes that break kernels (docs/semantics.md), f32
//   UnfusedVsCpu16.*    bf16 and f16 I/O against the CPU in the same dtype
//   Unfused.*           many rows (grid limits), determinism, streams,
//                       strides, lse optional, the refusals and messages
// Outputs are NaN-poisoned before every run, so an unwritten element fails.
// Which outputs were bit-identical to the CPU is recorded as test properties
// (<name>_bitwise = 1/0, and <name>_error for f32; see --gtest_output=xml).
// Every test skips, saying why, without a usable CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"

#ifndef GQATTN_WITH_CUDA

TEST(UnfusedSmall, NeedsCuda) { GTEST_SKIP() << "no CUDA device: this build has no CUDA"; }

#else

#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "attention_harness.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;
using gqattn::TensorRef;
using namespace gqattn::test;

// The unfused path computes what the CPU mirror computes, operation for
// operation, with correctly rounded exp, tanh and log; the host's libm may
// differ from those by an ulp on a few inputs, which moves a result by a few
// f32 rounding steps at most.
constexpr double kF32Tolerance = 1e-6;
// Gradients under a softcap: dS has the factor 1 - tanh^2(x), which for a
// saturated logit (tanh near +-1) turns one ulp of tanh into a relative error
// of up to ~1e-3 in that factor. glibc before 2.41 rounds tanhf wrongly on
// ~3% of inputs, so dq and dk may differ from the CPU's by ~2e-6 with large
// logits; they are held to the f32 bound of docs/semantics.md instead.
constexpr double kSoftcapGradTolerance = 1e-5;

constexpr uint64_t kSeed = 20261130;

using gqattn::make_problem;

// Skips (with the reason) where cuda-unfused cannot run; the reason is the
// device's absence or age, which Unfused.AvailabilityAndReasons pins down.
std::string why_unfused_cannot_run() {
  std::string why = why_no_cuda_device();
  if (!why.empty()) return why;
  const gqattn::Explanation e = gqattn::explain(make_problem(1, 8, 8, 1, 1, 8, true), DType::f32,
                                                Device::cuda, Backend::CudaUnfused);
  return e.supported ? "" : e.reason;
}

#define SKIP_WITHOUT_UNFUSED()                                                           \
  do {                                                                                   \
    GQATTN_SKIP_WITHOUT_CUDA();                                                          \
    const std::string unfused_reason_ = why_unfused_cannot_run();                        \
    if (!unfused_reason_.empty()) GTEST_SKIP() << "no CUDA device: " << unfused_reason_; \
  } while (0)

void record_bitwise(const std::string& name, bool bitwise) {
  ::testing::Test::RecordProperty(name + "_bitwise", bitwise ? 1 : 0);
}

// The measured error, so a run's XML shows each output's margin.
void record_error(const std::string& name, double error) {
  std::ostringstream text;
  text << std::scientific << std::setprecision(2) << error;
  ::testing::Test::RecordProperty(name + "_error", text.str());
}

// f32: every output within kF32Tolerance of the CPU's (gradients under a
// softcap: kSoftcapGradTolerance); padding untouched.
void expect_f32_match(const Problem& p, const ForwardResult& gf, const ForwardResult& cf,
                      const BackwardResult& gb, const BackwardResult& cb) {
  const double grad_tolerance = p.softcap > 0.0f ? kSoftcapGradTolerance : kF32Tolerance;
  struct Result {
    const char* name;
    Comparison c;
    double tolerance;
  };
  const Result results[] = {
      {"o", compare(gf.o, cf.o), kF32Tolerance},
      {"lse", compare(gf.lse, cf.lse), kF32Tolerance},
      {"dq", compare(gb.dq, cb.dq), grad_tolerance},
      {"dk", compare(gb.dk, cb.dk), grad_tolerance},
      {"dv", compare(gb.dv, cb.dv), kF32Tolerance},
  };
  for (const auto& [name, c, tolerance] : results) {
    EXPECT_LE(c.error, tolerance) << name << ": " << c.note;
    record_bitwise(name, c.bitwise);
    record_error(name, c.error);
  }
  EXPECT_TRUE(gf.padding_intact) << "forward wrote outside its tensors";
  EXPECT_TRUE(gb.padding_intact) << "backward wrote outside its tensors";
}

// bf16/f16, tight: each element equals the CPU's or is its neighbour in the
// dtype (one rounding of f32 values an ulp apart), or is within the f32
// tolerance of the largest magnitude; lse (f32) as in the f32 tests.
void expect_16bit_match(const Problem& p, DType dtype, const ForwardResult& gf,
                        const ForwardResult& cf, const BackwardResult& gb,
                        const BackwardResult& cb) {
  const double grad_tolerance = p.softcap > 0.0f ? kSoftcapGradTolerance : kF32Tolerance;
  struct Output {
    const char* name;
    const std::vector<float>& got;
    const std::vector<float>& ref;
    double tolerance;
  };
  const Output outputs[] = {{"o", gf.o, cf.o, kF32Tolerance},
                            {"dq", gb.dq, cb.dq, grad_tolerance},
                            {"dk", gb.dk, cb.dk, grad_tolerance},
                            {"dv", gb.dv, cb.dv, kF32Tolerance}};
  for (const Output& out : outputs) {
    EXPECT_EQ(beyond_one_step(dtype, out.got, out.ref, out.tolerance * max_abs(out.ref)), 0)
        << out.name;
    record_bitwise(out.name, same_bits(out.got, out.ref));
  }
  const Comparison lse = compare(gf.lse, cf.lse);
  EXPECT_LE(lse.error, kF32Tolerance) << lse.note;
  record_bitwise("lse", lse.bitwise);
}

// The full comparison: GPU forward against CPU forward; then both
// backwards from the CPU's o and lse, so gradients are compared alone.
void check_f32(const Problem& p, float magnitude = 1.0f, Layout layout = Layout::packed) {
  const Inputs in = random_inputs(p, DType::f32, kSeed, magnitude);
  const ForwardResult cf = cpu_forward(in);
  const ForwardResult gf = gpu_forward(Backend::CudaUnfused, in, layout);
  const BackwardResult cb = cpu_backward(in, cf);
  const BackwardResult gb = gpu_backward(Backend::CudaUnfused, in, cf, layout);
  expect_f32_match(p, gf, cf, gb, cb);
}

// ---- UnfusedSmall: tiny, for compute-sanitizer (memcheck, racecheck) -------

TEST(UnfusedSmall, CausalGqaF32) {
  SKIP_WITHOUT_UNFUSED();
  check_f32(make_problem(2, 13, 13, 4, 2, 40, true));
}

TEST(UnfusedSmall, WindowSoftcapBf16) {
  SKIP_WITHOUT_UNFUSED();
  Problem p = make_problem(1, 11, 17, 4, 1, 24, true);
  p.window = 4;
  p.softcap = 3.0f;
  const Inputs in = random_inputs(p, DType::bf16, kSeed, 2.0f);
  const ForwardResult cf = cpu_forward(in);
  const ForwardResult gf = gpu_forward(Backend::CudaUnfused, in);
  const BackwardResult cb = cpu_backward(in, cf);
  const BackwardResult gb = gpu_backward(Backend::CudaUnfused, in, cf);
  expect_16bit_match(p, DType::bf16, gf, cf, gb, cb);
}

TEST(UnfusedSmall, PaddedStrides) {
  SKIP_WITHOUT_UNFUSED();
  Problem p = make_problem(2, 9, 7, 2, 1, 33, false);
  p.window = 3;
  check_f32(p, 1.0f, Layout::padded);
}

// Tq > Tk causal: queries 0..6 see no key. Tq < Tk with a window: keys below
// off - window + 1 are seen by no query. Exact zeros and -inf, no NaN.
TEST(UnfusedSmall, EmptyRowsAndUnusedKeys) {
  SKIP_WITHOUT_UNFUSED();
  {
    const Problem p = make_problem(1, 12, 5, 2, 1, 16, true);
    const Inputs in = random_inputs(p, DType::f32, kSeed);
    const ForwardResult gf = gpu_forward(Backend::CudaUnfused, in);
    const BackwardResult gb = gpu_backward(Backend::CudaUnfused, in, gf);
    const int64_t empty_rows = p.Tq - p.Tk;
    for (int64_t h = 0; h < p.H; ++h) {
      for (int64_t i = 0; i < p.Tq; ++i) {
        const float lse = gf.lse[std::size_t(h * p.Tq + i)];
        if (i < empty_rows) {
          EXPECT_EQ(lse, -std::numeric_limits<float>::infinity()) << "h " << h << " i " << i;
        } else {
          EXPECT_TRUE(std::isfinite(lse)) << "h " << h << " i " << i;
        }
        for (int64_t x = 0; x < p.d; ++x) {
          const std::size_t e = std::size_t((i * p.H + h) * p.d + x);
          if (i < empty_rows) {
            EXPECT_EQ(gf.o[e], 0.0f);
            EXPECT_EQ(gb.dq[e], 0.0f);
          }
          EXPECT_FALSE(std::isnan(gf.o[e]) || std::isnan(gb.dq[e]));
        }
      }
    }
    check_f32(p);
  }
  {
    Problem p = make_problem(1, 5, 20, 2, 2, 16, true);
    p.window = 3;
    const int64_t first_used = p.Tk - p.Tq - p.window + 1;
    const Inputs in = random_inputs(p, DType::f32, kSeed);
    const ForwardResult gf = gpu_forward(Backend::CudaUnfused, in);
    const BackwardResult gb = gpu_backward(Backend::CudaUnfused, in, gf);
    for (int64_t j = 0; j < p.Tk; ++j) {
      for (int64_t x = 0; x < p.Hkv * p.d; ++x) {
        const std::size_t e = std::size_t(j * p.Hkv * p.d + x);
        if (j < first_used) {
          EXPECT_EQ(gb.dk[e], 0.0f) << "j " << j;
          EXPECT_EQ(gb.dv[e], 0.0f) << "j " << j;
        }
        EXPECT_FALSE(std::isnan(gb.dk[e]) || std::isnan(gb.dv[e]));
      }
    }
    check_f32(p);
  }
}

// ---- UnfusedVsCpuF32: the shapes that break kernels ------------------------

struct Case {
  std::string name;
  Problem problem;
  float magnitude = 1.0f;  // scales q and k: large logits
};

Case with(std::string name, Problem p, int64_t window = 0, float softcap = 0.0f,
          float magnitude = 1.0f) {
  p.window = window;
  p.softcap = softcap;
  return {std::move(name), p, magnitude};
}

std::vector<Case> f32_cases() {
  std::vector<Case> cases = {
      with("T1", make_problem(1, 1, 1, 2, 1, 64, true)),
      with("T1_noncausal", make_problem(2, 1, 1, 2, 2, 32, false)),
      with("T37_causal_gqa", make_problem(2, 37, 37, 4, 2, 64, true)),
      with("T37_noncausal", make_problem(1, 37, 37, 4, 2, 64, false)),
      with("Tq_lt_Tk_causal", make_problem(1, 20, 45, 4, 2, 32, true)),
      with("Tq_gt_Tk_causal", make_problem(1, 45, 20, 4, 2, 32, true)),
      with("Tq_gt_Tk_window", make_problem(1, 45, 20, 4, 2, 32, false), 6),
      with("Tq_lt_Tk_causal_window", make_problem(2, 19, 50, 4, 4, 64, true), 7),
      with("mqa_Hkv1", make_problem(1, 29, 29, 8, 1, 64, true)),
      with("mha_Hkv_eq_H", make_problem(1, 29, 29, 3, 3, 64, false)),
      with("window1_causal", make_problem(1, 37, 37, 2, 1, 32, true), 1),
      with("window1_noncausal", make_problem(1, 37, 37, 2, 1, 32, false), 1),
      with("window_ge_T", make_problem(1, 37, 37, 2, 1, 32, true), 100),
      with("window_eq_T_noncausal", make_problem(1, 37, 37, 2, 1, 32, false), 37),
      with("softcap_large_logits", make_problem(1, 37, 37, 4, 2, 64, true), 0, 20.0f, 6.0f),
      with("softcap_window_gqa_TqTk", make_problem(2, 30, 41, 4, 2, 48, true), 9, 5.0f, 3.0f),
      with("d1", make_problem(1, 23, 23, 2, 1, 1, true)),
      with("d33", make_problem(1, 23, 23, 2, 1, 33, false), 5),
      with("d300", make_problem(1, 17, 17, 2, 1, 300, true)),
  };
  for (int64_t d : {32, 64, 80, 96, 128, 192, 256})
    cases.push_back(with("d" + std::to_string(d), make_problem(1, 23, 23, 4, 2, d, true)));
  Case scaled = with("explicit_scale", make_problem(1, 21, 26, 2, 1, 64, false));
  scaled.problem.scale = 0.37f;
  cases.push_back(scaled);
  return cases;
}

class UnfusedVsCpuF32 : public ::testing::TestWithParam<Case> {};

TEST_P(UnfusedVsCpuF32, MatchesCpu) {
  SKIP_WITHOUT_UNFUSED();
  check_f32(GetParam().problem, GetParam().magnitude);
}

// Named functions, not lambdas: gtest's macro already has a parameter `info`.
std::string case_name(const ::testing::TestParamInfo<Case>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(Shapes, UnfusedVsCpuF32, ::testing::ValuesIn(f32_cases()), case_name);

// ---- UnfusedVsCpu16: bf16 and f16 I/O --------------------------------------

struct Case16 {
  Case base;
  DType dtype;
};

std::vector<Case16> cases16() {
  const std::vector<Case> shapes = {
      with("T37_causal_gqa", make_problem(2, 37, 37, 4, 2, 64, true)),
      with("softcap_window_TqTk", make_problem(1, 30, 41, 4, 2, 80, true), 9, 5.0f, 3.0f),
      with("mqa_noncausal_d128", make_problem(1, 25, 25, 4, 1, 128, false)),
      with("Tq_gt_Tk_causal", make_problem(1, 33, 20, 2, 1, 32, true)),
  };
  std::vector<Case16> out;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Case& c : shapes) out.push_back({c, dtype});
  return out;
}

class UnfusedVsCpu16 : public ::testing::TestWithParam<Case16> {};

TEST_P(UnfusedVsCpu16, MatchesCpuInSameDtype) {
  SKIP_WITHOUT_UNFUSED();
  const Case16& c = GetParam();
  const Inputs in = random_inputs(c.base.problem, c.dtype, kSeed, c.base.magnitude);
  const ForwardResult cf = cpu_forward(in);
  const ForwardResult gf = gpu_forward(Backend::CudaUnfused, in);
  const BackwardResult cb = cpu_backward(in, cf);
  const BackwardResult gb = gpu_backward(Backend::CudaUnfused, in, cf);
  expect_16bit_match(c.base.problem, c.dtype, gf, cf, gb, cb);
}

std::string case16_name(const ::testing::TestParamInfo<Case16>& param) {
  return param.param.base.name + (param.param.dtype == DType::bf16 ? "_bf16" : "_f16");
}

INSTANTIATE_TEST_SUITE_P(Shapes, UnfusedVsCpu16, ::testing::ValuesIn(cases16()), case16_name);

// ---- Unfused: launch limits, determinism, layouts, refusals ----------------

// B*H*Tq = 288000 rows: more than a grid's y limit (65535) and more threads
// than the H200 keeps resident (132 SMs x 2048), so the grid-stride loop
// runs; the 48 kv rows each walk 48000 query rows.
TEST(Unfused, ManyRowsBeyondGridLimits) {
  SKIP_WITHOUT_UNFUSED();
  check_f32(with("many_rows", make_problem(3, 24000, 8, 4, 2, 32, false), 3).problem);
}

// Same inputs, same bits: twice on the default stream and once on a stream
// of the caller's, for every output.
TEST(Unfused, DeterministicAcrossRunsAndStreams) {
  SKIP_WITHOUT_UNFUSED();
  Problem p = make_problem(2, 70, 70, 8, 2, 64, true);
  p.window = 33;
  p.softcap = 10.0f;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Inputs in = random_inputs(p, dtype, kSeed, 2.0f);
    const ForwardResult f1 = gpu_forward(Backend::CudaUnfused, in);
    const ForwardResult f2 = gpu_forward(Backend::CudaUnfused, in);
    const BackwardResult b1 = gpu_backward(Backend::CudaUnfused, in, f1);
    const BackwardResult b2 = gpu_backward(Backend::CudaUnfused, in, f1);
    Stream stream;
    const ForwardResult f3 = gpu_forward(Backend::CudaUnfused, in, Layout::packed, stream.get());
    const BackwardResult b3 =
        gpu_backward(Backend::CudaUnfused, in, f1, Layout::packed, stream.get());
    for (const ForwardResult* f : {&f2, &f3}) {
      EXPECT_TRUE(same_bits(f->o, f1.o));
      EXPECT_TRUE(same_bits(f->lse, f1.lse));
    }
    for (const BackwardResult* b : {&b2, &b3}) {
      EXPECT_TRUE(same_bits(b->dq, b1.dq));
      EXPECT_TRUE(same_bits(b->dk, b1.dk));
      EXPECT_TRUE(same_bits(b->dv, b1.dv));
    }
  }
}

// Strides change addresses, not arithmetic: padded and heads-first layouts
// give the packed layout's bits, and nothing outside the views is written.
TEST(Unfused, StridedLayoutsGivePackedBits) {
  SKIP_WITHOUT_UNFUSED();
  Problem p = make_problem(2, 21, 29, 4, 2, 40, true);
  p.window = 11;
  for (DType dtype : {DType::f32, DType::f16}) {
    const Inputs in = random_inputs(p, dtype, kSeed);
    const ForwardResult packed = gpu_forward(Backend::CudaUnfused, in);
    const BackwardResult packed_b = gpu_backward(Backend::CudaUnfused, in, packed);
    for (Layout layout : {Layout::padded, Layout::heads_first}) {
      const ForwardResult f = gpu_forward(Backend::CudaUnfused, in, layout);
      const BackwardResult b = gpu_backward(Backend::CudaUnfused, in, packed, layout);
      EXPECT_TRUE(same_bits(f.o, packed.o));
      EXPECT_TRUE(same_bits(f.lse, packed.lse));
      EXPECT_TRUE(same_bits(b.dq, packed_b.dq));
      EXPECT_TRUE(same_bits(b.dk, packed_b.dk));
      EXPECT_TRUE(same_bits(b.dv, packed_b.dv));
      EXPECT_TRUE(f.padding_intact);
      EXPECT_TRUE(b.padding_intact);
    }
  }
}

// lse.data == nullptr: o is unchanged and lse's buffer keeps its poison.
TEST(Unfused, ForwardWithoutLse) {
  SKIP_WITHOUT_UNFUSED();
  const Inputs in = random_inputs(make_problem(1, 19, 19, 2, 1, 32, true), DType::f32, kSeed);
  const ForwardResult with_lse = gpu_forward(Backend::CudaUnfused, in);
  const ForwardResult without = gpu_forward(Backend::CudaUnfused, in, Layout::packed, nullptr,
                                            /*write_lse=*/false);
  EXPECT_TRUE(same_bits(without.o, with_lse.o));
  for (float x : without.lse) EXPECT_TRUE(std::isnan(x)) << "lse written though data was null";
}

// P of B=64, H=64, Tq=Tk=65536 would take 64 TiB: refused with the sizes in
// the message, before any allocation and without writing an output.
TEST(Unfused, RefusesProblemWhosePDoesNotFit) {
  SKIP_WITHOUT_UNFUSED();
  const Problem p = make_problem(64, 65536, 65536, 64, 8, 64, true);
  // One small poisoned buffer stands for every tensor: nothing may touch it.
  constexpr std::size_t kBytes = 4096;
  DeviceBuffer buffer(kBytes);
  buffer.poison();
  auto ref = [&](int rank, const Shape4& shape) {
    TensorRef t = rank == 4 ? gqattn::contiguous(buffer.get(), DType::bf16, Device::cuda, shape[0],
                                                 shape[1], shape[2], shape[3])
                            : gqattn::contiguous(buffer.get(), DType::f32, Device::cuda, shape[0],
                                                 shape[1], shape[2]);
    return t;
  };
  const TensorRef q = ref(4, q_shape(p)), kv = ref(4, kv_shape(p)), lse = ref(3, lse_shape(p));
  // Outputs may share no byte with another argument (validation checks it
  // before any backend), so each output claims its own address range, 2^40
  // bytes apart (every tensor here spans less): never dereferenced, since
  // the backend refuses the problem before touching any tensor.
  auto elsewhere = [&](TensorRef t, int slot) {
    t.data = static_cast<char*>(buffer.get()) + (std::uintptr_t{1} << 40) * std::uintptr_t(slot);
    return t;
  };
  const gqattn::Options options = options_for(Backend::CudaUnfused);
  auto expect_refusal = [](const gqattn::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(what.find("cuda-unfused"), std::string::npos) << what;
    EXPECT_NE(what.find("needs"), std::string::npos) << what;
    EXPECT_NE(what.find("GiB for P [B,H,Tq,Tk] f32"), std::string::npos) << what;
    EXPECT_NE(what.find("use cuda-flash or cpu"), std::string::npos) << what;
  };
  try {
    gqattn::forward(p, q, kv, kv, elsewhere(q, 1), elsewhere(lse, 2), options);
    ADD_FAILURE() << "forward ran a problem whose P cannot fit";
  } catch (const gqattn::Error& e) {
    expect_refusal(e);
  }
  try {
    gqattn::backward(p, q, kv, kv, q, lse, q, elsewhere(q, 1), elsewhere(kv, 2), elsewhere(kv, 3),
                     options);
    ADD_FAILURE() << "backward ran a problem whose P cannot fit";
  } catch (const gqattn::Error& e) {
    expect_refusal(e);
  }
  const gqattn::Explanation e = gqattn::explain(p, DType::bf16, Device::cuda, Backend::CudaUnfused);
  EXPECT_FALSE(e.supported);
  EXPECT_NE(e.reason.find("P [B,H,Tq,Tk]"), std::string::npos) << e.reason;
  for (unsigned char byte : buffer.download<unsigned char>())
    ASSERT_EQ(byte, static_cast<unsigned char>(kPoisonByte)) << "a refused call wrote memory";
}

// A host pointer in a tensor that says cuda: an Error naming the argument.
TEST(Unfused, HostPointerLabelledCudaNamesTheArgument) {
  SKIP_WITHOUT_UNFUSED();
  const Problem p = make_problem(1, 8, 8, 2, 1, 16, true);
  const Inputs in = random_inputs(p, DType::f32, kSeed);
  DeviceTensor q = device_input(DType::f32, Layout::packed, q_shape(p), in.q);
  DeviceTensor k = device_input(DType::f32, Layout::packed, kv_shape(p), in.k);
  DeviceTensor v = device_input(DType::f32, Layout::packed, kv_shape(p), in.v);
  DeviceTensor o = device_tensor(DType::f32, Layout::packed, 4, q_shape(p));
  DeviceTensor lse = device_tensor(DType::f32, Layout::packed, 3, lse_shape(p));
  DeviceTensor dout = device_input(DType::f32, Layout::packed, q_shape(p), in.dout);
  DeviceTensor dq = device_tensor(DType::f32, Layout::packed, 4, q_shape(p));
  DeviceTensor dk = device_tensor(DType::f32, Layout::packed, 4, kv_shape(p));
  DeviceTensor dv = device_tensor(DType::f32, Layout::packed, 4, kv_shape(p));
  std::vector<float> host_q(in.q), host_lse(std::size_t(p.B * p.H * p.Tq)), host_dq(in.q.size());
  TensorRef bad_q = q.ref, bad_lse = lse.ref, bad_dq = dq.ref;
  bad_q.data = host_q.data();
  bad_lse.data = host_lse.data();
  bad_dq.data = host_dq.data();
  const gqattn::Options options = options_for(Backend::CudaUnfused);

  auto expect_names = [](const std::function<void()>& call, const std::string& argument) {
    try {
      call();
      ADD_FAILURE() << "accepted a host pointer for " << argument;
    } catch (const gqattn::Error& e) {
      EXPECT_NE(std::string(e.what()).find(argument + ".data"), std::string::npos) << e.what();
    }
  };
  expect_names([&] { gqattn::forward(p, bad_q, k.ref, v.ref, o.ref, lse.ref, options); }, "q");
  expect_names([&] { gqattn::forward(p, q.ref, k.ref, v.ref, o.ref, bad_lse, options); }, "lse");
  gqattn::forward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, options);
  device_synchronize();
  expect_names(
      [&] {
        gqattn::backward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, bad_dq, dk.ref, dv.ref,
                         options);
      },
      "dq");
  // The refused backward wrote nothing.
  bool intact = true;
  for (const DeviceTensor* t : {&dk, &dv})
    for (float x : download_values(*t, intact)) ASSERT_TRUE(std::isnan(x));
}

// Supported on every device of sm_80 or newer; refused for host tensors.
TEST(Unfused, AvailabilityAndReasons) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const Problem p = make_problem(1, 64, 64, 4, 2, 64, true);
  const gqattn::Explanation on_device =
      gqattn::explain(p, DType::bf16, Device::cuda, Backend::CudaUnfused);
  int current = 0, cc_major = 0;
  cuda_ok(cudaGetDevice(&current), "cudaGetDevice");
  cuda_ok(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, current), "cc");
  if (cc_major >= 8) {
    EXPECT_TRUE(on_device.supported) << on_device.reason;
  } else {
    EXPECT_FALSE(on_device.supported);
    EXPECT_NE(on_device.reason.find("sm_80"), std::string::npos) << on_device.reason;
  }
  const gqattn::Explanation on_host =
      gqattn::explain(p, DType::bf16, Device::cpu, Backend::CudaUnfused);
  EXPECT_FALSE(on_host.supported);
  EXPECT_NE(on_host.reason.find("cuda-unfused"), std::string::npos) << on_host.reason;
}

}  // namespace

#endif  // GQATTN_WITH_CUDA
