// Validation: every rule of src/api/validate.cpp and dispatch, one test each.
// Each asserts that gqattn::Error names the argument and the rule, and that
// no output was touched (outputs are NaN-poisoned and must stay so).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;
using gqattn::TensorRef;

// A small valid problem with packed f32 tensors on the CPU; tests break one thing.
struct Fixture {
  Problem p;
  std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
  TensorRef Q, K, V, O, LSE, dO, dQ, dK, dV;

  Fixture() {
    p.B = 2;
    p.Tq = 5;
    p.Tk = 7;
    p.H = 4;
    p.Hkv = 2;
    p.d = 8;
    p.causal = true;
    rebuild();
  }
  void rebuild() {
    const auto nq = std::size_t(p.B * p.Tq * p.H * p.d);
    const auto nk = std::size_t(p.B * p.Tk * p.Hkv * p.d);
    const float nan = std::nanf("");
    q.assign(nq, 0.25f);
    k.assign(nk, 0.5f);
    v.assign(nk, 0.75f);
    dout.assign(nq, 1.0f);
    o.assign(nq, nan);
    dq.assign(nq, nan);
    dk.assign(nk, nan);
    dv.assign(nk, nan);
    lse.assign(std::size_t(p.B * p.H * p.Tq), nan);
    using gqattn::contiguous;
    const DType f = DType::f32;
    const Device c = Device::cpu;
    Q = contiguous(q.data(), f, c, p.B, p.Tq, p.H, p.d);
    K = contiguous(k.data(), f, c, p.B, p.Tk, p.Hkv, p.d);
    V = contiguous(v.data(), f, c, p.B, p.Tk, p.Hkv, p.d);
    O = contiguous(o.data(), f, c, p.B, p.Tq, p.H, p.d);
    LSE = contiguous(lse.data(), f, c, p.B, p.H, p.Tq);
    dO = contiguous(dout.data(), f, c, p.B, p.Tq, p.H, p.d);
    dQ = contiguous(dq.data(), f, c, p.B, p.Tq, p.H, p.d);
    dK = contiguous(dk.data(), f, c, p.B, p.Tk, p.Hkv, p.d);
    dV = contiguous(dv.data(), f, c, p.B, p.Tk, p.Hkv, p.d);
  }
  void forward(gqattn::Options options = {}) { gqattn::forward(p, Q, K, V, O, LSE, options); }
  void backward(gqattn::Options options = {}) {
    gqattn::backward(p, Q, K, V, O, LSE, dO, dQ, dK, dV, options);
  }
  bool outputs_untouched() const {
    for (const auto* x : {&o, &lse, &dq, &dk, &dv})
      for (float e : *x)
        if (!std::isnan(e)) return false;
    return true;
  }
};

// Runs `call`, expecting an Error whose message contains every fragment.
void expect_error(const std::function<void()>& call, const std::vector<std::string>& fragments) {
  try {
    call();
    FAIL() << "expected gqattn::Error";
  } catch (const gqattn::Error& e) {
    const std::string message = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(message.find(f), std::string::npos) << "message: " << message << "\nmissing: " << f;
  }
}

TEST(Validation, ValidProblemRunsAndWritesOutputs) {
  Fixture f;
  f.forward();
  f.backward();
  for (const auto* x : {&f.o, &f.lse, &f.dq, &f.dk, &f.dv})
    for (float e : *x) ASSERT_FALSE(std::isnan(e));
}

TEST(Validation, SizesMustBePositive) {
  for (int64_t Problem::*field :
       {&Problem::B, &Problem::Tq, &Problem::Tk, &Problem::H, &Problem::Hkv, &Problem::d}) {
    Fixture f;
    f.p.*field = 0;
    expect_error([&] { f.forward(); }, {"= 0", "must be >= 1"});
    EXPECT_TRUE(f.outputs_untouched());
  }
}

TEST(Validation, HMustBeMultipleOfHkv) {
  Fixture f;
  f.p.H = 6;
  f.p.Hkv = 4;
  f.rebuild();
  expect_error([&] { f.forward(); }, {"H = 6", "multiple of Hkv = 4"});
  expect_error([&] { f.backward(); }, {"H = 6", "multiple of Hkv = 4"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, NegativeWindow) {
  Fixture f;
  f.p.window = -1;
  expect_error([&] { f.forward(); }, {"window = -1", "must be >= 0"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, NegativeOrInfiniteSoftcap) {
  Fixture f;
  f.p.softcap = -2.0f;
  expect_error([&] { f.forward(); }, {"softcap", "finite and >= 0"});
  f.p.softcap = INFINITY;
  expect_error([&] { f.forward(); }, {"softcap", "finite and >= 0"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, ScaleMustBePositiveAndFinite) {
  Fixture f;
  f.p.scale = 0.0f;
  expect_error([&] { f.forward(); }, {"scale", "finite and > 0"});
  f.p.scale = NAN;
  expect_error([&] { f.forward(); }, {"scale", "finite and > 0"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, NullPointer) {
  Fixture f;
  f.K.data = nullptr;
  expect_error([&] { f.forward(); }, {"k", "null pointer"});
  f.rebuild();
  f.dV.data = nullptr;
  expect_error([&] { f.backward(); }, {"dv", "null pointer"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, ForwardLseIsOptionalBackwardLseIsNot) {
  Fixture f;
  f.LSE.data = nullptr;
  f.forward();  // allowed: lse is not written
  EXPECT_FALSE(std::isnan(f.o[0]));
  expect_error([&] { f.backward(); }, {"lse", "null pointer"});
}

TEST(Validation, WrongShape) {
  Fixture f;
  f.V.shape[1] = f.p.Tk + 1;
  expect_error([&] { f.forward(); }, {"v.shape", "[B, Tk, Hkv, d]", "[2, 7, 2, 8]"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, WrongRank) {
  Fixture f;
  f.LSE.rank = 4;
  expect_error([&] { f.forward(); }, {"lse.rank = 4", "must be 3"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, DtypeMismatch) {
  Fixture f;
  f.K.dtype = DType::bf16;
  expect_error([&] { f.forward(); }, {"k.dtype = bf16", "must be f32"});
  f.rebuild();
  f.LSE.dtype = DType::f16;
  expect_error([&] { f.forward(); }, {"lse.dtype = f16", "always f32"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, DeviceMismatch) {
  Fixture f;
  f.O.device = Device::cuda;
  expect_error([&] { f.forward(); }, {"o.device = cuda", "must be cpu"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, LastDimensionMustBeContiguous) {
  Fixture f;
  f.Q.stride[3] = 2;
  expect_error([&] { f.forward(); }, {"q.stride[3] = 2", "contiguous"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, NegativeStride) {
  Fixture f;
  f.K.stride[1] = -16;
  expect_error([&] { f.forward(); }, {"k.stride[1] = -16", ">= 0"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, OutputMayNotRepeatElements) {
  Fixture f;
  f.dQ.stride[1] = 0;  // every query row would write the same place
  expect_error([&] { f.backward(); }, {"dq.stride[1] = 0", "may not repeat"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, BroadcastInputsAreAllowed) {
  Fixture f;
  f.K.stride[0] = 0;  // both batches read the same keys
  f.V.stride[0] = 0;
  f.forward();
  EXPECT_FALSE(std::isnan(f.o[0]));
}

TEST(Validation, MisalignedPointer) {
  Fixture f;
  f.Q.data = reinterpret_cast<char*>(f.q.data()) + 2;
  expect_error([&] { f.forward(); }, {"q.data", "aligned"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, ExplicitUnavailableBackendFailsWithReason) {
  Fixture f;
  gqattn::Options options;
  options.backend = Backend::CudaUnfused;
  // CPU tensors: the CUDA backend says why not; it never falls back to cpu.
  expect_error([&] { f.forward(options); }, {"backend", "cuda-unfused"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(Validation, ExplainNamesEveryRejectedBackend) {
  Problem p;
  const auto why = gqattn::explain(p, DType::bf16, Device::cuda, Backend::Auto);
  if (why.supported) GTEST_SKIP() << "a CUDA backend can run here";
  for (const char* name : {"cuda-hopper", "cuda-flash", "cpu"})
    EXPECT_NE(why.reason.find(name), std::string::npos) << why.reason;
}

TEST(Validation, AutoOnCpuTensorsPicksCpuFlash) {
  Problem p;
  const auto why = gqattn::explain(p, DType::f32, Device::cpu, Backend::Auto);
  EXPECT_TRUE(why.supported) << why.reason;
  EXPECT_EQ(why.chosen, Backend::CpuFlash);
}

TEST(Validation, ParseBackend) {
  EXPECT_EQ(gqattn::parse_backend("cuda-flash"), Backend::CudaFlash);
  EXPECT_EQ(gqattn::parse_backend("auto"), Backend::Auto);
  expect_error([] { gqattn::parse_backend("gpu"); }, {"backend = 'gpu'", "must be one of"});
}

}  // namespace
