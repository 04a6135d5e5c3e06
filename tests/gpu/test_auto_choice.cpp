// Auto on CUDA tensors: it takes a fused backend where one runs the problem
// and never cuda-unfused (whose memory grows with Tq x Tk); a problem only
// cuda-unfused runs (f32, or d outside the fused head dims) is refused with
// every backend's reason and the hint to name cuda-unfused, which then runs
// it. Needs a device; skips without one.
#include <gtest/gtest.h>

#include <string>

#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Pass;

#ifdef GQATTN_WITH_CUDA

TEST(AutoChoice, NeverPicksCudaUnfused) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const gqattn::Problem p = gqattn::make_problem(1, 64, 64, 2, 1, 64, true);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const auto f32 = gqattn::explain(p, DType::f32, Device::cuda, Backend::Auto, pass);
    EXPECT_FALSE(f32.supported);
    EXPECT_NE(f32.reason.find("name it"), std::string::npos) << f32.reason;
    EXPECT_NE(f32.reason.find("cuda-flash"), std::string::npos) << f32.reason;
    const auto named = gqattn::explain(p, DType::f32, Device::cuda, Backend::CudaUnfused, pass);
    EXPECT_TRUE(named.supported) << named.reason;
    const auto bf16 = gqattn::explain(p, DType::bf16, Device::cuda, Backend::Auto, pass);
    if (bf16.supported) {
      EXPECT_NE(bf16.chosen, Backend::CudaUnfused);
    }
  }
}

#endif

}  // namespace
