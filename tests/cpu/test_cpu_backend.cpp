// What the cpu backend reports through the public API: it supports every
// valid problem on host memory, in every dtype, refuses CUDA tensors with a
// reason, and Auto falls back to it in a CUDA-less build.
#include <string>

#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

TEST(CpuBackend, SupportsHostTensorsOfEveryDtype) {
  const Problem p = make_problem(1, 3, 5, 4, 2, 7, true, 2, 3.0f);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const Explanation e = explain(p, dtype, Device::cpu, Backend::Cpu);
    EXPECT_TRUE(e.supported) << e.reason;
    EXPECT_EQ(e.chosen, Backend::Cpu);
    EXPECT_TRUE(e.reason.empty());
  }
}

TEST(CpuBackend, RefusesCudaTensorsSayingWhy) {
  const Explanation e =
      explain(make_problem(1, 4, 4, 1, 1, 8), DType::f32, Device::cuda, Backend::Cpu);
  EXPECT_FALSE(e.supported);
  EXPECT_NE(e.reason.find("cpu"), std::string::npos) << e.reason;
  EXPECT_NE(e.reason.find("host memory"), std::string::npos) << e.reason;
}

TEST(CpuBackend, IsListedAsCompiledAndAvailable) {
  bool found = false;
  for (const BackendStatus& s : backend_status()) {
    if (s.backend != Backend::Cpu) continue;
    found = true;
    EXPECT_TRUE(s.compiled);
    EXPECT_TRUE(s.available) << s.reason;
  }
  EXPECT_TRUE(found);
}

#ifndef GQATTN_WITH_CUDA
TEST(CpuBackend, AutoPicksCpuFlashWithoutCuda) {
  const Explanation e =
      explain(make_problem(1, 4, 4, 1, 1, 8), DType::bf16, Device::cpu, Backend::Auto);
  EXPECT_TRUE(e.supported) << e.reason;
  EXPECT_EQ(e.chosen, Backend::CpuFlash);
}
#endif

}  // namespace
}  // namespace gqattn::test
