// cuda-flash: the backward launcher template: the preprocessing kernel
// (lse2, D), then the dK/dV kernel (one CTA per key tile, kv head, batch),
// then the dQ kernel (one CTA per query tile, head, batch), all on the
// caller's stream, 1-D grids. With a fused dQ (the plan's) the dK/dV
// kernel also adds dQ into it and the postprocess kernel writes dq instead
// of the dQ kernel: ordered zeroes the counters and the kernel adds in
// ascending key-tile order (see backward_dkdv_kernel.cuh); atomic (not
// deterministic) zeroes the accumulator instead. The dK/dV kernel takes the
// plan's tile (plan.hpp: the default, or a smaller one for devices whose
// shared memory per block is below the default tile's); a kFusedDqOnly tile
// has no separate dQ path (the plan never asks for it). A padded head dim
// (the plan's head_dim below kD) runs the padded instances of the dK/dV,
// dQ and postprocess kernels, dense and varlen batches alike (the
// preprocessing kernel reads p.head_dim in every instance). Instantiated
// per head dimension by launch_backward_d*.cu. Checked through
// tests/gpu/test_flash_*.cpp and tests/gpu/test_padded_head_dims.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/flash/backward_dkdv_kernel.cuh"
#include "cuda/flash/backward_dq_kernel.cuh"
#include "cuda/flash/backward_dq_postprocess.cuh"
#include "cuda/flash/launchers.hpp"
#include "cuda/fused/backward_preprocess.cuh"
#include "gqattn/error.hpp"

namespace gqattn::flash {

template <int kD, typename Elem, bool kSoftcap, DkdvTileSize kSize>
void launch_backward_typed(const BackwardPlan& plan, const fused::BackwardParams& p,
                           cudaStream_t stream) {
  const bool padded = plan.head_dim != kD;
  {
    const int blocks = int(preprocess_blocks(p.B, p.H, p.tq_padded));
    fused::backward_preprocess_kernel<kD, Elem>
        <<<blocks, fused::kPreprocessThreads, 0, stream>>>(p);
    cuda::check_launch("cuda-flash fused::backward_preprocess_kernel");
  }
  using DkdvT = DkdvTile<kD, kSize>;
  constexpr int kDkdvThreads = DkdvT::kWarpsN * DkdvT::kWarpsD * fused::kWarpSize;
  const int dkdv_grid = int(dkdv_blocks(kD, p.B, p.Hkv, p.mask.tk, kSize));
  if (plan.dq != DqStrategy::kSeparate) {
    // Workspace rows: B*H blocks of tq_padded, or a varlen batch's H blocks
    // of varlen_head_rows (params.hpp); the plan allocated as many.
    const std::size_t rows = p.seq.varlen() ? std::size_t(p.H) * std::size_t(p.varlen_head_rows)
                                            : std::size_t(p.B) * p.H * std::size_t(p.tq_padded);
    if (plan.dq == DqStrategy::kOrdered) {  // the first key tile stores
      const std::size_t counters = rows / DkdvT::kBlockM * sizeof(int);
      GQATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_counters, 0, counters, stream));
    } else {  // atomic: every key tile adds
      const std::size_t accum = rows * kD * sizeof(float);
      GQATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, accum, stream));
    }
    constexpr int kSmem = int(dkdv_smem_bytes<kD, true, kSize>());
    // The varlen instance only for a varlen batch, the padded one for every
    // batch of a padded head dim (backward_dkdv_kernel.cuh).
    auto kernel = padded ? backward_dkdv_kernel<kD, Elem, kSoftcap, true, kSize, true, true>
                  : p.seq.varlen() ? backward_dkdv_kernel<kD, Elem, kSoftcap, true, kSize, true>
                                   : backward_dkdv_kernel<kD, Elem, kSoftcap, true, kSize, false>;
    GQATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    kernel<<<dkdv_grid, kDkdvThreads, kSmem, stream>>>(p);
    cuda::check_launch(plan.dq == DqStrategy::kOrdered
                           ? "cuda-flash backward_dkdv_kernel (ordered dQ)"
                           : "cuda-flash backward_dkdv_kernel (atomic dQ)");
    const int blocks = int(dq_postprocess_blocks(kD, p.B, p.H, p.tq_padded));
    auto postprocess = padded ? backward_dq_postprocess_kernel<kD, Elem, DkdvT::kBlockM, true>
                              : backward_dq_postprocess_kernel<kD, Elem, DkdvT::kBlockM, false>;
    postprocess<<<blocks, kDqPostThreads, 0, stream>>>(p);
    cuda::check_launch("cuda-flash backward_dq_postprocess_kernel");
    return;
  }
  if constexpr (DkdvT::kFusedDqOnly) {
    // The plan never asks for this (plan_backward refuses it).
    throw Error("cuda-flash's backward",
                "internal: the separate dQ path was asked of a dK/dV "
                "tile that has only the fused dQ paths");
  } else {
    {
      constexpr int kSmem = int(dkdv_smem_bytes<kD, false, kSize>());
      auto kernel = padded ? backward_dkdv_kernel<kD, Elem, kSoftcap, false, kSize, true, true>
                    : p.seq.varlen()
                        ? backward_dkdv_kernel<kD, Elem, kSoftcap, false, kSize, true>
                        : backward_dkdv_kernel<kD, Elem, kSoftcap, false, kSize, false>;
      GQATTN_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      kernel<<<dkdv_grid, kDkdvThreads, kSmem, stream>>>(p);
      cuda::check_launch("cuda-flash backward_dkdv_kernel");
    }
    using Tile = DqTile<kD>;
    constexpr int kThreads = Tile::kWarps * fused::kWarpSize;
    constexpr int kSmem = int(dq_smem_bytes<kD>());
    const int blocks = int(dq_blocks(kD, p.B, p.H, p.mask.tq));
    // The varlen instance only for a varlen batch, the padded one for every
    // batch of a padded head dim (backward_dq_kernel.cuh).
    auto kernel = padded           ? backward_dq_kernel<kD, Elem, kSoftcap, true, true>
                  : p.seq.varlen() ? backward_dq_kernel<kD, Elem, kSoftcap, true>
                                   : backward_dq_kernel<kD, Elem, kSoftcap, false>;
    GQATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    kernel<<<blocks, kThreads, kSmem, stream>>>(p);
    cuda::check_launch("cuda-flash backward_dq_kernel");
  }
}

template <int kD, DkdvTileSize kSize>
void launch_backward_tile(const BackwardPlan& plan, const fused::BackwardParams& p,
                          cudaStream_t s) {
  if (plan.elem == fused::ElemType::bf16) {
    if (plan.softcap)
      launch_backward_typed<kD, __nv_bfloat16, true, kSize>(plan, p, s);
    else
      launch_backward_typed<kD, __nv_bfloat16, false, kSize>(plan, p, s);
  } else {
    if (plan.softcap)
      launch_backward_typed<kD, __half, true, kSize>(plan, p, s);
    else
      launch_backward_typed<kD, __half, false, kSize>(plan, p, s);
  }
}

template <int kD>
void launch_backward(const BackwardPlan& plan, const fused::BackwardParams& p, void* stream) {
  using S = DkdvTileSize;
  const auto s = static_cast<cudaStream_t>(stream);
  if constexpr (int(smallest_dkdv_tile(kD)) >= int(S::kSmaller)) {
    if (plan.tile == S::kSmaller) return launch_backward_tile<kD, S::kSmaller>(plan, p, s);
  }
  if constexpr (int(smallest_dkdv_tile(kD)) >= int(S::kSmall)) {
    if (plan.tile == S::kSmall) return launch_backward_tile<kD, S::kSmall>(plan, p, s);
  }
  if (plan.tile != S::kDefault)
    throw Error("cuda-flash's backward", "internal: the plan's dK/dV tile has no kernel");
  launch_backward_tile<kD, S::kDefault>(plan, p, s);
}

}  // namespace gqattn::flash
