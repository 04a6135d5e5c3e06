// The fused KV-cache path's launcher template: the append (when there are
// new keys), the attention kernel instance of the plan (element type,
// softcap, warps over rows or keys) on a (row tile x split, kv head,
// sequence) grid, and the combine when the plan splits. Instantiated per
// head dimension by launch_d*.cu. Checked through tests/gpu/test_kv_cache.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/kv_cache/attend_kernel.cuh"
#include "cuda/kv_cache/combine_kernel.cuh"
#include "cuda/kv_cache/launchers.hpp"

namespace gqattn::kv_cache {

template <int kD, typename Elem, bool kSoftcap, int kWarpsM>
void launch_attend(const Plan& plan, const Params& p, cudaStream_t stream) {
  auto kernel = attend_kernel<kD, Elem, kSoftcap, kWarpsM>;
  GQATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(plan.smem_bytes)));
  const dim3 grid(unsigned(plan.m_tiles * plan.num_splits), unsigned(p.Hkv), unsigned(p.B));
  kernel<<<grid, kWarps * fused::kWarpSize, plan.smem_bytes, stream>>>(p);
  cuda::check_launch("kv-cache attend_kernel");
}

template <int kD, typename Elem>
void launch_typed(const Plan& plan, const Params& p, cudaStream_t stream) {
  if (p.score.softcap) {
    if (plan.warps_m == 1)
      launch_attend<kD, Elem, true, 1>(plan, p, stream);
    else
      launch_attend<kD, Elem, true, kWarps>(plan, p, stream);
  } else {
    if (plan.warps_m == 1)
      launch_attend<kD, Elem, false, 1>(plan, p, stream);
    else
      launch_attend<kD, Elem, false, kWarps>(plan, p, stream);
  }
  if (plan.num_splits > 1) {
    const int64_t rows = int64_t(p.B) * p.H * p.Tq;
    combine_kernel<kD, Elem>
        <<<unsigned((rows + kCombineWarps - 1) / kCombineWarps), kCombineThreads, 0, stream>>>(p);
    cuda::check_launch("kv-cache combine_kernel");
  }
}

template <int kD>
void launch(const Plan& plan, const Params& p, fused::ElemType elem, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.t_new > 0) launch_append(p, s);
  if (elem == fused::ElemType::bf16)
    launch_typed<kD, __nv_bfloat16>(plan, p, s);
  else
    launch_typed<kD, __half>(plan, p, s);
}

}  // namespace gqattn::kv_cache
