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

// Calls f with the attention kernel instance of (warps_m, softcap).
template <int kD, typename Elem, class F>
void with_attend_kernel(int warps_m, bool softcap, F&& f) {
  if (softcap) {
    if (warps_m == 1) return f(attend_kernel<kD, Elem, true, 1>);
    if (warps_m == 2) return f(attend_kernel<kD, Elem, true, 2>);
    return f(attend_kernel<kD, Elem, true, kWarps>);
  }
  if (warps_m == 1) return f(attend_kernel<kD, Elem, false, 1>);
  if (warps_m == 2) return f(attend_kernel<kD, Elem, false, 2>);
  return f(attend_kernel<kD, Elem, false, kWarps>);
}

template <int kD, typename Elem>
void launch_typed(const Plan& plan, const Params& p, cudaStream_t stream) {
  with_attend_kernel<kD, Elem>(plan.warps_m, p.score.softcap, [&](auto kernel) {
    GQATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(plan.smem_bytes)));
    const dim3 grid(unsigned(plan.m_tiles * plan.num_splits), unsigned(p.Hkv), unsigned(p.B));
    kernel<<<grid, kWarps * fused::kWarpSize, plan.smem_bytes, stream>>>(p);
    cuda::check_launch("kv-cache attend_kernel");
  });
  if (plan.num_splits > 1) {
    const int64_t rows = int64_t(p.B) * p.H * p.Tq;
    combine_kernel<kD, Elem>
        <<<unsigned((rows + kCombineWarps - 1) / kCombineWarps), kCombineThreads, 0, stream>>>(p);
    cuda::check_launch("kv-cache combine_kernel");
  }
}

template <int kD>
int resident_ctas_per_sm(int warps_m, bool softcap, fused::ElemType elem) {
  int ctas = 0;
  auto query = [&](auto kernel) {
    const std::size_t smem = smem_bytes(kD, warps_m);
    GQATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    GQATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &ctas, kernel, kWarps * fused::kWarpSize, smem));
  };
  if (elem == fused::ElemType::bf16)
    with_attend_kernel<kD, __nv_bfloat16>(warps_m, softcap, query);
  else
    with_attend_kernel<kD, __half>(warps_m, softcap, query);
  return ctas;
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
