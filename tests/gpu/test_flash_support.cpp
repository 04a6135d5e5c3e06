// cuda-flash's refusals and their messages: unsupported head dims and dtypes
// (host-only, no device needed), Auto preferring cuda-flash where it runs,
// misaligned tensors getting an Error that names the argument before
// anything is written, the dK/dV tile switch GQATTN_FLASH_DKDV_TILE refusing
// an unknown value (and separate dQ on d256's smaller tile), and the dQ strategy switch
// GQATTN_FLASH_DQ refusing atomic dQ for a deterministic call and unknown values (needs a device;
// skips without one).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

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

TEST(FlashSupport, RefusesOtherHeadDims) {
  const gqattn::Explanation e =
      gqattn::explain(small_problem(80), DType::bf16, Device::cuda, Backend::CudaFlash);
  EXPECT_FALSE(e.supported);
  EXPECT_NE(e.reason.find("not supported: cuda-flash supports d in {64, 128, 256} and dtypes "
                          "bf16/f16 (got d=80)"),
            std::string::npos)
      << e.reason;
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

gqattn::Error backward_error(const char* strategy, bool deterministic) {
  return gqattn::test::backward_switch_error(small_problem(64), Backend::CudaFlash,
                                             "GQATTN_FLASH_DQ", strategy, deterministic);
}

TEST(FlashSupport, AtomicDqNeedsNondeterministicCall) {
  const gqattn::Explanation why =
      gqattn::explain(small_problem(64), DType::bf16, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const gqattn::Error e = backward_error("atomic", /*deterministic=*/true);
  EXPECT_EQ(e.argument(), "GQATTN_FLASH_DQ = atomic") << e.what();
  EXPECT_NE(e.rule().find("needs Options::deterministic = false"), std::string::npos) << e.what();
}

TEST(FlashSupport, UnknownDqStrategyNamesTheSwitch) {
  const gqattn::Explanation why =
      gqattn::explain(small_problem(64), DType::bf16, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const gqattn::Error e = backward_error("atomc", /*deterministic=*/false);
  EXPECT_EQ(e.argument(), "GQATTN_FLASH_DQ = 'atomc'") << e.what();
  EXPECT_NE(e.rule().find("must be ordered, separate or atomic"), std::string::npos) << e.what();
}

TEST(FlashSupport, UnknownDkdvTileNamesTheSwitch) {
  const gqattn::Explanation why =
      gqattn::explain(small_problem(64), DType::bf16, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const gqattn::Error e = gqattn::test::backward_switch_error(
      small_problem(64), Backend::CudaFlash, "GQATTN_FLASH_DKDV_TILE", "smal", true);
  EXPECT_EQ(e.argument(), "GQATTN_FLASH_DKDV_TILE = 'smal'") << e.what();
  EXPECT_NE(e.rule().find("must be default, small or smaller"), std::string::npos) << e.what();
}

// d256's smaller dK/dV tile (sm86 / sm89, or forced) has no separate dQ
// kernel: asking for it is refused before anything is written.
TEST(FlashSupport, SeparateDqOnTheSmallerTileNamesTheRule) {
  const gqattn::Explanation why =
      gqattn::explain(small_problem(256), DType::bf16, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const gqattn::test::ScopedEnv tile("GQATTN_FLASH_DKDV_TILE", "smaller");
  const gqattn::Error e = gqattn::test::backward_switch_error(
      small_problem(256), Backend::CudaFlash, "GQATTN_FLASH_DQ", "separate", true);
  EXPECT_EQ(e.argument(), "GQATTN_FLASH_DQ = separate") << e.what();
  EXPECT_EQ(e.rule(),
            "not supported: cuda-flash's backward at d=256 on devices with less than 145 KB of "
            "shared memory per block (and with GQATTN_FLASH_DKDV_TILE = smaller) runs only the "
            "fused dQ paths, ordered and atomic")
      << e.what();
}

#else

TEST(FlashSupport, NeedsCuda) { GTEST_SKIP() << "no CUDA device: this build has no CUDA"; }

#endif

}  // namespace
