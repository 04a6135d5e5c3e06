// cuda-flash: the backward launcher template: the preprocessing kernel
// (lse2, D), then the dK/dV kernel (one CTA per key tile, kv head, batch),
// then the dQ kernel (one CTA per query tile, head, batch), all on the
// caller's stream, 1-D grids. With p.dq_accum set (fused dQ) the dK/dV
// kernel also adds dQ into it and the postprocess kernel writes dq instead
// of the dQ kernel: ordered (p.dq_counters set) zeroes the counters and the
// kernel adds in ascending key-tile order (see backward_dkdv_kernel.cuh);
// atomic (p.dq_counters null, not deterministic) zeroes the accumulator
// instead. The dK/dV kernel takes DkdvTile<kD, true> when the backend asks
// for the small-shared-memory tile (devices whose shared memory per block is
// below the default tile's: use_small_smem_dkdv_tile in tile_sizes.hpp).
// Instantiated per head
// dimension by launch_backward_d*.cu. Checked through
// tests/gpu/test_flash_*.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/flash/backward_dkdv_kernel.cuh"
#include "cuda/flash/backward_dq_kernel.cuh"
#include "cuda/flash/backward_dq_postprocess.cuh"
#include "cuda/flash/backward_preprocess.cuh"
#include "cuda/flash/launchers.hpp"

namespace gqattn::flash {

template <int kD, typename Elem, bool kSoftcap, bool kSmallSmem>
void launch_backward_typed(const BackwardParams& p, cudaStream_t stream) {
  {
    const int blocks = int(preprocess_blocks(p.B, p.H, p.tq_padded));
    backward_preprocess_kernel<kD, Elem><<<blocks, kPreprocessThreads, 0, stream>>>(p);
    cuda::check_launch("cuda-flash backward_preprocess_kernel");
  }
  using DkdvT = DkdvTile<kD, kSmallSmem>;
  constexpr int kDkdvThreads = DkdvT::kWarpsN * DkdvT::kWarpsD * kWarpSize;
  const int dkdv_grid = int(dkdv_blocks(kD, p.B, p.Hkv, p.mask.tk, kSmallSmem));
  if (p.dq_accum != nullptr) {
    const std::size_t rows = std::size_t(p.B) * p.H * std::size_t(p.tq_padded);
    if (p.dq_counters != nullptr) {  // ordered: the first key tile stores
      const std::size_t counters = rows / DkdvT::kBlockM * sizeof(int);
      GQATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_counters, 0, counters, stream));
    } else {  // atomic: every key tile adds
      const std::size_t accum = rows * kD * sizeof(float);
      GQATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, accum, stream));
    }
    constexpr int kSmem = int(dkdv_smem_bytes<kD, true, kSmallSmem>());
    auto kernel = backward_dkdv_kernel<kD, Elem, kSoftcap, true, kSmallSmem>;
    GQATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    kernel<<<dkdv_grid, kDkdvThreads, kSmem, stream>>>(p);
    cuda::check_launch(p.dq_counters != nullptr ? "cuda-flash backward_dkdv_kernel (ordered dQ)"
                                                : "cuda-flash backward_dkdv_kernel (atomic dQ)");
    const int blocks = int(dq_postprocess_blocks(kD, p.B, p.H, p.tq_padded));
    backward_dq_postprocess_kernel<kD, Elem, DkdvT::kBlockM>
        <<<blocks, kDqPostThreads, 0, stream>>>(p);
    cuda::check_launch("cuda-flash backward_dq_postprocess_kernel");
    return;
  }
  {
    constexpr int kSmem = int(dkdv_smem_bytes<kD, false, kSmallSmem>());
    auto kernel = backward_dkdv_kernel<kD, Elem, kSoftcap, false, kSmallSmem>;
    GQATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    kernel<<<dkdv_grid, kDkdvThreads, kSmem, stream>>>(p);
    cuda::check_launch("cuda-flash backward_dkdv_kernel");
  }
  {
    using Tile = DqTile<kD>;
    constexpr int kThreads = Tile::kWarps * kWarpSize;
    constexpr int kSmem = int(dq_smem_bytes<kD>());
    const int blocks = int(dq_blocks(kD, p.B, p.H, p.mask.tq));
    auto kernel = backward_dq_kernel<kD, Elem, kSoftcap>;
    GQATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    kernel<<<blocks, kThreads, kSmem, stream>>>(p);
    cuda::check_launch("cuda-flash backward_dq_kernel");
  }
}

template <int kD, bool kSmallSmem>
void launch_backward_tile(const BackwardParams& p, ElemType elem, cudaStream_t s) {
  if (elem == ElemType::bf16) {
    if (p.score.softcap)
      launch_backward_typed<kD, __nv_bfloat16, true, kSmallSmem>(p, s);
    else
      launch_backward_typed<kD, __nv_bfloat16, false, kSmallSmem>(p, s);
  } else {
    if (p.score.softcap)
      launch_backward_typed<kD, __half, true, kSmallSmem>(p, s);
    else
      launch_backward_typed<kD, __half, false, kSmallSmem>(p, s);
  }
}

template <int kD>
void launch_backward(const BackwardParams& p, ElemType elem, bool small_smem_dkdv_tile,
                     void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if constexpr (has_small_smem_dkdv_tile(kD)) {
    if (small_smem_dkdv_tile) return launch_backward_tile<kD, true>(p, elem, s);
  }
  launch_backward_tile<kD, false>(p, elem, s);
}

}  // namespace gqattn::flash
