// cuda-hopper: the backward launcher template: the fused layer's
// preprocessing kernel (lse2, D into the workspace), then the dK/dV kernel
// (one CTA per key tile, kv head, batch), then either the dQ kernel (one CTA
// per query tile, head, batch) or, where the plan (plan.hpp) fuses dQ
// (d <= 128), the conversion of the accumulator the dK/dV kernel added
// into; all on the caller's stream, 1-D grids. It decides nothing itself.
// Instantiated per head dimension by backward/launch_d*.cu. Checked through
// tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/fused/backward_preprocess.cuh"
#include "cuda/hopper/backward/dkdv_kernel.cuh"
#include "cuda/hopper/backward/dq_convert.cuh"
#include "cuda/hopper/backward/dq_kernel.cuh"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/dependent_launch.hpp"
#include "cuda/hopper/launchers.hpp"
#include "cuda/hopper/plan.hpp"

namespace gqattn::hopper::bwd {

template <int kD, typename Elem, bool kSoftcap, bool kFusedDq, bool kVarlen>
void launch_dkdv(const BackwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = int(DkdvSmem<kD, kFusedDq>::kAllocBytes);
  const int blocks = int(dkdv_blocks(p.c.B, p.c.Hkv, p.c.mask.tk, kD));
  auto kernel = backward_dkdv_kernel<kD, Elem, kSoftcap, kFusedDq, kVarlen>;
  GQATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kernel<<<blocks, kBwdThreads, kSmem, stream>>>(p);
  cuda::check_launch("cuda-hopper backward_dkdv_kernel");
}

// Fused dQ: zero the semaphores (the accumulator needs no zeroing: the
// first key tile of a query tile stores), the dK/dV kernel that adds into
// it, then dq = scale * accumulator.
template <int kD, typename Elem, bool kSoftcap, bool kVarlen>
void launch_dkdv_fused_dq(const BackwardParams& p, cudaStream_t stream) {
  const std::size_t semaphores = p.c.seq.varlen()
                                     ? fused_dq_varlen_semaphores(p.c.H, p.c.varlen_head_rows)
                                     : fused_dq_semaphores(p.c.B, p.c.H, p.c.tq_padded);
  GQATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_semaphores, 0, semaphores * sizeof(int), stream));
  launch_dkdv<kD, Elem, kSoftcap, true, kVarlen>(p, stream);
  const int blocks = int(dq_convert_blocks(p.c.B, p.c.H, p.c.tq_padded));
  // A programmatic dependent launch: scheduled
  // once every dK/dV CTA has started (backward_dkdv_kernel), so it can use
  // the SMs the dK/dV kernel's last wave leaves idle; a persistent grid,
  // since its CTAs wait for their blocks and hold their SMs while they do.
  const int ctas =
      std::min(blocks, kDqConvertCtasPerSm * cuda::current_device_properties().multiprocessors);
  launch_dependent(backward_dq_convert_kernel<kD, Elem, kVarlen>, unsigned(ctas), kDqConvertThreads,
                   dq_convert_pending_bytes(blocks, ctas), stream, /*overlap=*/true, p);
  cuda::check_launch("cuda-hopper backward_dq_convert_kernel");
}

// kVarlen: the kernels of varlen batches (sequence.cuh).
template <int kD, typename Elem, bool kSoftcap, bool kVarlen>
void launch_backward_typed(const BackwardPlan& plan, const BackwardParams& p, cudaStream_t stream) {
  static_assert(fused::kWorkspaceRowAlign % DqTile<kD>::kBlockM == 0 &&
                    fused::kWorkspaceRowAlign % DkdvTile<kD>::kBlockM == 0,
                "whole query tiles of lse2 / D lie inside a workspace row");
  {
    const int blocks =
        int(ceil_div(int64_t(p.c.B) * p.c.H * p.c.tq_padded, fused::kPreprocessRowsPerBlock));
    fused::backward_preprocess_kernel<kD, Elem>
        <<<blocks, fused::kPreprocessThreads, 0, stream>>>(p.c);
    cuda::check_launch("cuda-hopper backward_preprocess_kernel (cuda-flash's)");
  }
  if constexpr (DkdvTile<kD>::kFusedDqSupported) {
    if (plan.fused_dq) {
      launch_dkdv_fused_dq<kD, Elem, kSoftcap, kVarlen>(p, stream);
      return;
    }
  }
  launch_dkdv<kD, Elem, kSoftcap, false, kVarlen>(p, stream);
  constexpr int kSmem = int(DqSmem<kD>::kAllocBytes);
  const int blocks = int(dq_blocks(p.c.B, p.c.H, p.c.mask.tq, kD));
  auto kernel = backward_dq_kernel<kD, Elem, kSoftcap, kVarlen>;
  GQATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kernel<<<blocks, kBwdThreads, kSmem, stream>>>(p);
  cuda::check_launch("cuda-hopper backward_dq_kernel");
}

template <int kD, typename Elem, bool kSoftcap>
void launch_backward_dense_or_varlen(const BackwardPlan& plan, const BackwardParams& p,
                                     cudaStream_t stream) {
  if (p.c.seq.varlen())
    launch_backward_typed<kD, Elem, kSoftcap, true>(plan, p, stream);
  else
    launch_backward_typed<kD, Elem, kSoftcap, false>(plan, p, stream);
}

template <int kD>
void launch_backward(const BackwardPlan& plan, const BackwardParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (plan.elem == ElemType::bf16) {
    if (plan.softcap)
      launch_backward_dense_or_varlen<kD, __nv_bfloat16, true>(plan, p, s);
    else
      launch_backward_dense_or_varlen<kD, __nv_bfloat16, false>(plan, p, s);
  } else {
    if (plan.softcap)
      launch_backward_dense_or_varlen<kD, __half, true>(plan, p, s);
    else
      launch_backward_dense_or_varlen<kD, __half, false>(plan, p, s);
  }
}

}  // namespace gqattn::hopper::bwd
