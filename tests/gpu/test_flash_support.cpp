// cuda-flash's refusals and their messages: unsupported head dims and dtypes
// (host-only, no device needed), Auto preferring cuda-flash where it runs,
// misaligned tensors getting an Error that names the argument before
// anything is written, and forced plans it cannot take refused before
// anything is written: the atomic dQ forced on a deterministic call, and the
// separate dQ forced on d256's smaller dK/dV tile (both forced through the
// plan override; needs a device, skips without one). The override's parse
// errors are tests/cpu/test_plan_override.cpp's.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "api/plan_override.hpp"
#include "attention_harness.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/error.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;

#ifdef GQATTN_WITH_CUDA

Problem small_problem(int64_t d) {
  Problem p;
  p.B = 1;
  p.Tq = p.Tk = 64;
  p.H = 2;
  p.Hkv = 1;
  p.d = d;
  p.causal = true;
  return p;
}

// Padded head dims run (d = 80 on the d = 128 kernels); d not a multiple of
// 8, or above 256, is refused naming the rule.
TEST(FlashSupport, RefusesOtherHeadDims) {
  for (const int64_t d : {84, 264}) {
    const gqattn::Explanation e =
        gqattn::explain(small_problem(d), DType::bf16, Device::cuda, Backend::CudaFlash);
    EXPECT_FALSE(e.supported);
    const std::string want =
        "not supported: cuda-flash supports d <= 256, a multiple of 8, and dtypes bf16/f16 (got d=";
    EXPECT_NE(e.reason.find(want + std::to_string(d) + ")"), std::string::npos) << e.reason;
  }
  const gqattn::Explanation padded =
      gqattn::explain(small_problem(80), DType::bf16, Device::cuda, Backend::CudaFlash);
  if (padded.supported) return;  // else only for a reason of the device
  EXPECT_EQ(padded.reason.find("d <= 256"), std::string::npos) << padded.reason;
}

TEST(FlashSupport, RefusesF32) {
  const gqattn::Explanation e =
      gqattn::explain(small_problem(64), DType::f32, Device::cuda, Backend::CudaFlash);
  EXPECT_FALSE(e.supported);
  EXPECT_NE(e.reason.find("(got dtype f32)"), std::string::npos) << e.reason;
}

TEST(FlashSupport, RefusesTheCpu) {
  const gqattn::Explanation e =
      gqattn::explain(small_problem(64), DType::bf16, Device::cpu, Backend::CudaFlash);
  EXPECT_FALSE(e.supported);
}

TEST(FlashSupport, AutoPicksFlashWhereItRuns) {
  const Problem p = small_problem(128);
  const gqattn::Explanation flash =
      gqattn::explain(p, DType::bf16, Device::cuda, Backend::CudaFlash);
  if (!flash.supported) GTEST_SKIP() << flash.reason;
  const gqattn::Explanation any = gqattn::explain(p, DType::bf16, Device::cuda, Backend::Auto);
  ASSERT_TRUE(any.supported) << any.reason;
  // The hopper backend, where built and usable, comes first.
  EXPECT_TRUE(any.chosen == Backend::CudaFlash || any.chosen == Backend::CudaHopper);
}

// q.data 2 bytes past a 16-byte boundary (aligned to its element, so
// validation accepts it): cuda-flash must refuse with a message naming q.
TEST(FlashSupport, MisalignedPointerNamesTheArgument) {
  const Problem p = small_problem(64);
  const gqattn::Explanation why = gqattn::explain(p, DType::bf16, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  constexpr std::size_t kElem = 2;
  const std::size_t q_elems = std::size_t(p.B * p.Tq * p.H * p.d);
  const std::size_t kv_elems = std::size_t(p.B * p.Tk * p.Hkv * p.d);
  gqattn::test::DeviceBuffer q((q_elems + 8) * kElem), k(kv_elems * kElem), v(kv_elems * kElem),
      o(q_elems * kElem);
  o.poison();
  auto ref = [&](void* data, int64_t T, int64_t heads) {
    return gqattn::contiguous(data, DType::bf16, Device::cuda, p.B, T, heads, p.d);
  };
  const gqattn::TensorRef q_bad = ref(static_cast<char*>(q.get()) + kElem, p.Tq, p.H);
  gqattn::TensorRef lse;  // not written
  gqattn::Options options;
  options.backend = Backend::CudaFlash;
  try {
    gqattn::forward(p, q_bad, ref(k.get(), p.Tk, p.Hkv), ref(v.get(), p.Tk, p.Hkv),
                    ref(o.get(), p.Tq, p.H), lse, options);
    FAIL() << "a misaligned q was accepted";
  } catch (const gqattn::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda-flash"), std::string::npos) << what;
    EXPECT_NE(what.find("q.data must be 16-byte aligned"), std::string::npos) << what;
  }
  // Nothing was written: o is still all poison.
  const std::vector<uint16_t> out = o.download<uint16_t>();
  for (uint16_t bits : out) ASSERT_EQ(bits, 0xFFFFu);
}

// A row stride of d + 4 elements (8 bytes short of a 16-byte multiple).
TEST(FlashSupport, MisalignedStrideNamesTheArgument) {
  const Problem p = small_problem(64);
  const gqattn::Explanation why = gqattn::explain(p, DType::bf16, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  constexpr std::size_t kElem = 2;
  constexpr int64_t kOddGap = 4;
  const int64_t row = p.Hkv * p.d + kOddGap;
  const std::size_t q_elems = std::size_t(p.B * p.Tq * p.H * p.d);
  const std::size_t kv_elems = std::size_t(p.B * p.Tk * row);
  gqattn::test::DeviceBuffer q(q_elems * kElem), k(kv_elems * kElem), v(kv_elems * kElem),
      o(q_elems * kElem);
  gqattn::TensorRef k_ref =
      gqattn::contiguous(k.get(), DType::bf16, Device::cuda, p.B, p.Tk, p.Hkv, p.d);
  k_ref.stride[1] = row;
  k_ref.stride[0] = row * p.Tk;
  auto ref = [&](void* data, int64_t T, int64_t heads) {
    return gqattn::contiguous(data, DType::bf16, Device::cuda, p.B, T, heads, p.d);
  };
  gqattn::Options options;
  options.backend = Backend::CudaFlash;
  try {
    gqattn::forward(p, ref(q.get(), p.Tq, p.H), k_ref, ref(v.get(), p.Tk, p.Hkv),
                    ref(o.get(), p.Tq, p.H), gqattn::TensorRef{}, options);
    FAIL() << "a k row stride of " << row << " elements was accepted";
  } catch (const gqattn::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("k.stride[1]*2 bytes must be a multiple of 16"), std::string::npos) << what;
  }
}

gqattn::detail::PlanOverride forced(
    gqattn::detail::DqPath dq,
    gqattn::detail::DkdvTileChoice tile = gqattn::detail::DkdvTileChoice::rule) {
  gqattn::detail::PlanOverride force;
  force.dq_path = dq;
  force.dkdv_tile = tile;
  return force;
}

// Forced atomic dQ on a deterministic call: refused at the call, before
// anything is written.
TEST(FlashSupport, AtomicDqNeedsNondeterministicCall) {
  const gqattn::Explanation why = gqattn::explain(small_problem(64), DType::bf16, Device::cuda,
                                                  Backend::CudaFlash, gqattn::Pass::backward);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const gqattn::Error e = gqattn::test::backward_forced_error(
      small_problem(64), Backend::CudaFlash, forced(gqattn::detail::DqPath::atomic),
      /*deterministic=*/true);
  EXPECT_EQ(e.argument(), "backend") << e.what();
  EXPECT_EQ(e.rule(),
            "cuda-flash: dq=atomic: cuda-flash's atomic dQ is not deterministic: it needs "
            "Options::deterministic = false")
      << e.what();
}

// d256's smaller dK/dV tile (sm86 / sm89, or forced) has no separate dQ
// kernel: forcing it there is refused before anything is written.
TEST(FlashSupport, SeparateDqOnTheSmallerTileNamesTheRule) {
  const gqattn::Explanation why = gqattn::explain(small_problem(256), DType::bf16, Device::cuda,
                                                  Backend::CudaFlash, gqattn::Pass::backward);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const gqattn::Error e = gqattn::test::backward_forced_error(
      small_problem(256), Backend::CudaFlash,
      forced(gqattn::detail::DqPath::separate, gqattn::detail::DkdvTileChoice::smaller),
      /*deterministic=*/true);
  EXPECT_EQ(e.argument(), "backend") << e.what();
  EXPECT_EQ(e.rule(),
            "cuda-flash: dq=separate: not supported: cuda-flash's backward at d=256 on its "
            "smaller dK/dV tile runs only the fused dQ paths")
      << e.what();
}

#else

TEST(FlashSupport, NeedsCuda) { GTEST_SKIP() << "no CUDA device: this build has no CUDA"; }

#endif

}  // namespace
