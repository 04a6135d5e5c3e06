// Validation of varlen calls (Problem::varlen), through gqattn::forward and
// gqattn::backward on the cpu backend with host tensors: every rule of
// src/api/varlen.cpp (the offsets' pointers, sizes, devices, alignment and
// values) and the packed shapes of src/api/validate.cpp, plus dispatch's
// pairing of Problem::varlen with the overload that takes offsets. Each
// asserts that gqattn::Error names the argument (Error::argument()) and the
// rule, and that no output was written (outputs are NaN-poisoned and must
// stay so). Also: packed tensors of no rows may have null data, and
// offsets in host memory are checked even with Options::check_offsets =
// false.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::OffsetsRef;
using gqattn::Problem;
using gqattn::TensorRef;
using gqattn::VarlenOffsets;

OffsetsRef offsets_ref(const std::vector<int32_t>& x) {
  OffsetsRef r;
  r.data = x.empty() ? nullptr : x.data();
  r.device = Device::cpu;
  r.size = int64_t(x.size());
  return r;
}

// A valid varlen batch of three sequences (2, 0, 3 queries over 3, 1, 4
// keys; the second sequence uses none of its key) with packed f32 tensors
// on the host; tests break one thing.
struct Fixture {
  Problem p;
  std::vector<int32_t> cu_q = {0, 2, 2, 5}, cu_k = {0, 3, 4, 8}, used = {3, 0, 4};
  std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
  TensorRef Q, K, V, O, LSE, dO, dQ, dK, dV;
  VarlenOffsets offsets;
  gqattn::Options options;

  Fixture() {
    p.varlen = true;
    p.B = 3;
    p.Tq = 3;  // max_seqlen_q
    p.Tk = 4;  // max_seqlen_k
    p.H = 4;
    p.Hkv = 2;
    p.d = 8;
    p.causal = true;
    options.backend = Backend::Cpu;
    rebuild();
  }
  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
  // Tensors sized from the offsets' last entries (as a caller packs them).
  void rebuild() {
    const auto nq = std::size_t(total_q() * p.H * p.d);
    const auto nk = std::size_t(total_k() * p.Hkv * p.d);
    const float nan = std::nanf("");
    q.assign(nq, 0.25f);
    k.assign(nk, 0.5f);
    v.assign(nk, 0.75f);
    dout.assign(nq, 1.0f);
    o.assign(nq, nan);
    dq.assign(nq, nan);
    dk.assign(nk, nan);
    dv.assign(nk, nan);
    lse.assign(std::size_t(p.H * total_q()), nan);
    using gqattn::contiguous;
    const DType f = DType::f32;
    const Device c = Device::cpu;
    auto ptr = [](std::vector<float>& x) { return x.empty() ? nullptr : x.data(); };
    Q = contiguous(ptr(q), f, c, total_q(), p.H, p.d);
    K = contiguous(ptr(k), f, c, total_k(), p.Hkv, p.d);
    V = contiguous(ptr(v), f, c, total_k(), p.Hkv, p.d);
    O = contiguous(ptr(o), f, c, total_q(), p.H, p.d);
    dO = contiguous(ptr(dout), f, c, total_q(), p.H, p.d);
    dQ = contiguous(ptr(dq), f, c, total_q(), p.H, p.d);
    dK = contiguous(ptr(dk), f, c, total_k(), p.Hkv, p.d);
    dV = contiguous(ptr(dv), f, c, total_k(), p.Hkv, p.d);
    LSE = TensorRef{};
    LSE.data = ptr(lse);
    LSE.dtype = f;
    LSE.device = c;
    LSE.rank = 2;
    LSE.shape[0] = p.H;
    LSE.shape[1] = total_q();
    LSE.stride[0] = total_q();
    LSE.stride[1] = 1;
    offsets = {offsets_ref(cu_q), offsets_ref(cu_k), offsets_ref(used)};
  }
  void forward() { gqattn::forward(p, offsets, Q, K, V, O, LSE, options); }
  void backward() { gqattn::backward(p, offsets, Q, K, V, O, LSE, dO, dQ, dK, dV, options); }
  bool outputs_untouched() const {
    for (const auto* x : {&o, &lse, &dq, &dk, &dv})
      for (float e : *x)
        if (!std::isnan(e)) return false;
    return true;
  }
};

// Runs `call`, expecting an Error whose argument contains `argument` and
// whose message contains every fragment.
void expect_error(const std::function<void()>& call, const std::string& argument,
                  const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "expected gqattn::Error naming " << argument;
  } catch (const gqattn::Error& e) {
    EXPECT_NE(e.argument().find(argument), std::string::npos)
        << "argument: " << e.argument() << "\nexpected it to name: " << argument;
    const std::string message = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(message.find(f), std::string::npos) << "message: " << message << "\nmissing: " << f;
  }
}

// Both passes of `f` fail naming `argument`, and nothing is written.
void expect_both_fail(Fixture& f, const std::string& argument,
                      const std::vector<std::string>& fragments) {
  expect_error([&] { f.forward(); }, argument, fragments);
  expect_error([&] { f.backward(); }, argument, fragments);
  EXPECT_TRUE(f.outputs_untouched()) << "an output was written";
}

TEST(VarlenValidation, ValidBatchRunsAndWritesEveryOutput) {
  Fixture f;
  f.forward();
  f.backward();
  for (const auto* x : {&f.o, &f.lse, &f.dq, &f.dk, &f.dv})
    for (float e : *x) ASSERT_FALSE(std::isnan(e));
}

// ---- dispatch: Problem::varlen and the overload ------------------------------

TEST(VarlenValidation, VarlenProblemNeedsTheOffsetsOverload) {
  Fixture f;
  expect_error([&] { gqattn::forward(f.p, f.Q, f.K, f.V, f.O, f.LSE, f.options); },
               "problem.varlen = true", {"overload that takes VarlenOffsets"});
  expect_error(
      [&] { gqattn::backward(f.p, f.Q, f.K, f.V, f.O, f.LSE, f.dO, f.dQ, f.dK, f.dV, f.options); },
      "problem.varlen = true", {"overload that takes VarlenOffsets"});
  EXPECT_TRUE(f.outputs_untouched());
}

TEST(VarlenValidation, OffsetsNeedAVarlenProblem) {
  Fixture f;
  f.p.varlen = false;
  expect_both_fail(f, "problem.varlen = false", {"must be true"});
}

// ---- the offsets' pointers, sizes, devices, alignment ------------------------

TEST(VarlenValidation, NullOffsets) {
  {
    Fixture f;
    f.offsets.cu_seqlens_q.data = nullptr;
    expect_both_fail(f, "cu_seqlens_q", {"null pointer"});
  }
  {
    Fixture f;
    f.offsets.cu_seqlens_k.data = nullptr;
    expect_both_fail(f, "cu_seqlens_k", {"null pointer"});
  }
}

TEST(VarlenValidation, OffsetsSizes) {
  {
    Fixture f;
    f.offsets.cu_seqlens_q.size = 3;
    expect_both_fail(f, "cu_seqlens_q.size = 3", {"must be 4"});
  }
  {
    Fixture f;
    f.offsets.cu_seqlens_k.size = 5;
    expect_both_fail(f, "cu_seqlens_k.size = 5", {"must be 4"});
  }
  {
    Fixture f;
    f.offsets.seqused_k.size = 4;
    expect_both_fail(f, "seqused_k.size = 4", {"must be 3"});
  }
}

TEST(VarlenValidation, OffsetsOnAnotherDevice) {
  {
    Fixture f;
    f.offsets.cu_seqlens_q.device = Device::cuda;
    expect_both_fail(f, "cu_seqlens_q.device = cuda", {"must be cpu"});
  }
  {
    Fixture f;
    f.offsets.seqused_k.device = Device::cuda;
    expect_both_fail(f, "seqused_k.device = cuda", {"must be cpu"});
  }
}

TEST(VarlenValidation, MisalignedOffsets) {
  Fixture f;
  std::vector<int32_t> storage(8, 0);
  // One byte into an int32 array: never dereferenced, the rule fires first.
  f.offsets.cu_seqlens_k.data =
      reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(storage.data()) + 1);
  expect_both_fail(f, "cu_seqlens_k", {"not aligned", "4 bytes"});
}

// ---- the offsets' values (host memory: always checked) ------------------------

TEST(VarlenValidation, FirstOffsetMustBeZero) {
  Fixture f;
  f.cu_q = {1, 2, 2, 5};
  f.offsets.cu_seqlens_q = offsets_ref(f.cu_q);
  expect_both_fail(f, "cu_seqlens_q[0] = 1", {"must be 0"});
}

TEST(VarlenValidation, DecreasingOffsets) {
  {
    Fixture f;
    f.cu_q = {0, 3, 2, 5};
    f.offsets.cu_seqlens_q = offsets_ref(f.cu_q);
    expect_both_fail(f, "cu_seqlens_q[2] = 2", {"never decrease"});
  }
  {
    Fixture f;
    f.cu_k = {0, 3, 1, 8};
    f.offsets.cu_seqlens_k = offsets_ref(f.cu_k);
    expect_both_fail(f, "cu_seqlens_k[2] = 1", {"never decrease"});
  }
}

TEST(VarlenValidation, LastOffsetMustEqualThePackedRows) {
  {
    Fixture f;
    f.cu_q = {0, 2, 2, 4};  // the tensors keep 5 rows
    f.offsets.cu_seqlens_q = offsets_ref(f.cu_q);
    expect_both_fail(f, "cu_seqlens_q[B] = 4", {"packed rows, 5"});
  }
  {
    Fixture f;
    f.cu_k = {0, 3, 4, 7};  // the tensors keep 8 rows
    f.offsets.cu_seqlens_k = offsets_ref(f.cu_k);
    expect_both_fail(f, "cu_seqlens_k[B] = 7", {"packed rows, 8"});
  }
}

TEST(VarlenValidation, SequenceLongerThanMaxSeqlen) {
  {
    Fixture f;
    f.p.Tq = 2;  // sequence 2 has 3 queries
    expect_both_fail(f, "cu_seqlens_q sequence 2", {"3 rows", "max_seqlen_q"});
  }
  {
    Fixture f;
    f.p.Tk = 3;  // sequence 2 has 4 keys
    expect_both_fail(f, "cu_seqlens_k sequence 2", {"4 rows", "max_seqlen_k"});
  }
}

TEST(VarlenValidation, SequsedKOutOfRange) {
  {
    Fixture f;
    f.used = {3, -1, 4};
    f.offsets.seqused_k = offsets_ref(f.used);
    expect_both_fail(f, "seqused_k[1] = -1", {"must be in [0, 1]"});
  }
  {
    Fixture f;
    f.used = {4, 0, 4};  // sequence 0 has 3 keys
    f.offsets.seqused_k = offsets_ref(f.used);
    expect_both_fail(f, "seqused_k[0] = 4", {"must be in [0, 3]"});
  }
}

TEST(VarlenValidation, HostOffsetsAreCheckedEvenWhenCheckOffsetsIsFalse) {
  Fixture f;
  f.options.check_offsets = false;
  f.cu_q = {0, 3, 2, 5};
  f.offsets.cu_seqlens_q = offsets_ref(f.cu_q);
  expect_both_fail(f, "cu_seqlens_q[2] = 2", {"never decrease"});
}

// ---- packed shapes (validate.cpp) ------------------------------------------

TEST(VarlenValidation, PackedTensorsHaveRankThree) {
  Fixture f;
  f.Q = gqattn::contiguous(f.q.data(), DType::f32, Device::cpu, 1, f.total_q(), f.p.H, f.p.d);
  expect_both_fail(f, "q.rank = 4", {"must be 3", "[total_q, H, d]"});
}

TEST(VarlenValidation, LseIsHeadsByTotalQ) {
  {
    Fixture f;
    f.LSE = gqattn::contiguous(f.lse.data(), DType::f32, Device::cpu, 1, f.p.H, f.total_q());
    expect_both_fail(f, "lse.rank = 3", {"must be 2", "[H, total_q]"});
  }
  {
    Fixture f;
    f.LSE.shape[1] = f.total_q() - 1;
    expect_both_fail(f, "lse.shape = [4, 4]", {"[H, total_q] = [4, 5]"});
  }
}

TEST(VarlenValidation, OutputsFollowTheTotalsOfQAndK) {
  {
    Fixture f;
    f.O.shape[0] = f.total_q() - 1;
    expect_error([&] { f.forward(); }, "o.shape = [4, 4, 8]", {"[total_q, H, d] = [5, 4, 8]"});
    EXPECT_TRUE(f.outputs_untouched());
  }
  {
    Fixture f;
    f.V.shape[0] = f.total_k() - 1;
    expect_both_fail(f, "v.shape = [7, 2, 8]", {"[total_k, Hkv, d] = [8, 2, 8]"});
  }
  {
    Fixture f;
    f.dK.shape[0] = f.total_k() - 1;
    expect_error([&] { f.backward(); }, "dk.shape = [7, 2, 8]", {"[total_k, Hkv, d] = [8, 2, 8]"});
    EXPECT_TRUE(f.outputs_untouched());
  }
  {
    Fixture f;
    f.dO.shape[0] = f.total_q() + 1;
    expect_error([&] { f.backward(); }, "do.shape = [6, 4, 8]", {"[total_q, H, d] = [5, 4, 8]"});
    EXPECT_TRUE(f.outputs_untouched());
  }
}

TEST(VarlenValidation, HeadsAndDimensionFollowTheProblem) {
  {
    Fixture f;
    f.K.shape[1] = f.p.Hkv + 1;
    expect_both_fail(f, "k.shape = [8, 3, 8]", {"[total_k, Hkv, d] = [8, 2, 8]"});
  }
  {
    Fixture f;
    f.dQ.shape[2] = f.p.d * 2;
    expect_error([&] { f.backward(); }, "dq.shape = [5, 4, 16]", {"[total_q, H, d] = [5, 4, 8]"});
    EXPECT_TRUE(f.outputs_untouched());
  }
}

TEST(VarlenValidation, PackedRowsFitInt32Offsets) {
  {
    Fixture f;
    f.Q.shape[0] = int64_t{1} << 31;  // never read: the rule fires first
    expect_both_fail(f, "q.shape[0] = 2147483648", {"[0, 2^31)"});
  }
  {
    Fixture f;
    f.K.shape[0] = -1;
    expect_both_fail(f, "k.shape[0] = -1", {"[0, 2^31)"});
  }
}

TEST(VarlenValidation, NullDataOnlyForPackedTensorsWithoutRows) {
  Fixture f;
  f.V.data = nullptr;  // v has 8 rows
  expect_both_fail(f, "v", {"null pointer"});
}

// Every sequence without queries: q, o, lse, do, dq have no rows and no
// data; the call runs, and backward zeroes dk, dv (no query reads a key).
TEST(VarlenValidation, NullDataAllowedForEmptyPackedTensors) {
  Fixture f;
  f.cu_q = {0, 0, 0, 0};
  f.rebuild();
  ASSERT_EQ(f.Q.data, nullptr);
  ASSERT_EQ(f.LSE.data, nullptr);
  f.forward();
  f.backward();
  for (const auto* x : {&f.dk, &f.dv})
    for (float e : *x) EXPECT_EQ(e, 0.0f);
}

// Every sequence without keys: k, v, dk, dv have no rows and no data;
// queries keep no key (o = 0, lse = -inf, dq = 0).
TEST(VarlenValidation, NullKeyDataAllowedWhenNoSequenceHasKeys) {
  Fixture f;
  f.cu_k = {0, 0, 0, 0};
  f.used.clear();
  f.rebuild();
  ASSERT_EQ(f.K.data, nullptr);
  f.forward();
  f.backward();
  for (float e : f.o) EXPECT_EQ(e, 0.0f);
  for (float e : f.lse) EXPECT_EQ(e, -INFINITY);
  for (float e : f.dq) EXPECT_EQ(e, 0.0f);
}

// ---- the memory rule covers the offsets ------------------------------------

TEST(VarlenValidation, OutputMayNotOverlapTheOffsets) {
  Fixture f;
  // cu_seqlens_q placed inside o's storage (valid values, so only the
  // memory rule can refuse it).
  static_assert(sizeof(float) == sizeof(int32_t), "4-byte elements");
  std::memcpy(f.o.data() + 8, f.cu_q.data(), f.cu_q.size() * sizeof(int32_t));
  f.offsets.cu_seqlens_q.data = reinterpret_cast<const int32_t*>(f.o.data() + 8);
  expect_error([&] { f.forward(); }, "o", {"must not overlap cu_seqlens_q"});
  for (const auto* x : {&f.lse, &f.dq, &f.dk, &f.dv})
    for (float e : *x) EXPECT_TRUE(std::isnan(e)) << "an output was written";
}

}  // namespace
