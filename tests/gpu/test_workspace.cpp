// The CUDA backends' workspace pool (src/cuda/common/workspace.hpp): a
// backward on every CUDA backend that runs here gives the same bits with a
// fresh pool, with the workspace the pool kept from the previous call, and
// after gqattn::release_workspace_memory() returned it to the driver (the
// next call maps it afresh); every gradient element written (the harness
// poisons them with NaN). Skips, saying why, where no CUDA backend runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_harness.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"

#ifdef GQATTN_WITH_CUDA

namespace {

using gqattn::Backend;
using gqattn::DType;
using gqattn::test::BackwardResult;

constexpr uint64_t kSeed = 20261211;

bool all_finite(const std::vector<float>& x) {
  for (float e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

TEST(Workspace, BackwardSameBitsWhenReusedAndAfterRelease) {
  GQATTN_SKIP_WITHOUT_CUDA();
  gqattn::Problem p;
  p.B = 2;
  p.Tq = p.Tk = 200;
  p.H = 4;
  p.Hkv = 2;
  p.d = 128;
  p.causal = true;
  const gqattn::test::Inputs in = gqattn::test::random_inputs(p, DType::bf16, kSeed);
  const gqattn::test::ForwardResult fwd = gqattn::test::cpu_forward(in);
  std::string why_none;
  int ran = 0;
  for (Backend backend : {Backend::CudaHopper, Backend::CudaFlash, Backend::CudaUnfused}) {
    const gqattn::Explanation e =
        gqattn::explain(p, DType::bf16, gqattn::Device::cuda, backend, gqattn::Pass::backward);
    if (!e.supported) {
      why_none += std::string(gqattn::backend_name(backend)) + ": " + e.reason + "; ";
      continue;
    }
    SCOPED_TRACE(gqattn::backend_name(backend));
    ++ran;
    gqattn::release_workspace_memory();
    const BackwardResult fresh = gqattn::test::gpu_backward(backend, in, fwd);
    const BackwardResult reused = gqattn::test::gpu_backward(backend, in, fwd);
    gqattn::release_workspace_memory();
    const BackwardResult remapped = gqattn::test::gpu_backward(backend, in, fwd);
    gqattn::release_workspace_memory();
    EXPECT_TRUE(fresh.padding_intact && all_finite(fresh.dq) && all_finite(fresh.dk) &&
                all_finite(fresh.dv));
    for (const BackwardResult* r : {&reused, &remapped}) {
      const char* which = r == &reused ? "reused" : "remapped";
      EXPECT_TRUE(gqattn::test::same_bits(r->dq, fresh.dq)) << which;
      EXPECT_TRUE(gqattn::test::same_bits(r->dk, fresh.dk)) << which;
      EXPECT_TRUE(gqattn::test::same_bits(r->dv, fresh.dv)) << which;
    }
  }
  if (ran == 0) GTEST_SKIP() << "no CUDA backend runs this backward: " << why_none;
}

}  // namespace

#endif  // GQATTN_WITH_CUDA
