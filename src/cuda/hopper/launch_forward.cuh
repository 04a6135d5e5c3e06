// cuda-hopper: the forward launcher template: picks the kernel instance for
// the element type and softcap, opts in to its shared memory, and launches
// one CTA of kThreads per (query tile, head, batch) on a 1-D grid.
// Instantiated per head dimension by launch_forward_d*.cu. Checked through
// tests/gpu/test_hopper_forward.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/cuda_check.hpp"
#include "cuda/hopper/forward_kernel.cuh"
#include "cuda/hopper/launchers.hpp"

namespace gqattn::hopper {

template <int kD, typename Elem, bool kSoftcap>
void launch_forward_typed(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = int(forward_smem_bytes<kD>());
  const int blocks = int(forward_blocks(kD, p.B, p.H, p.mask.tq));
  auto kernel = forward_kernel<kD, Elem, kSoftcap>;
  GQATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kernel<<<blocks, kThreads, kSmem, stream>>>(p);
  cuda::check_launch("cuda-hopper forward_kernel");
}

template <int kD>
void launch_forward(const ForwardParams& p, ElemType elem, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (elem == ElemType::bf16) {
    if (p.score.softcap)
      launch_forward_typed<kD, __nv_bfloat16, true>(p, s);
    else
      launch_forward_typed<kD, __nv_bfloat16, false>(p, s);
  } else {
    if (p.score.softcap)
      launch_forward_typed<kD, __half, true>(p, s);
    else
      launch_forward_typed<kD, __half, false>(p, s);
  }
}

}  // namespace gqattn::hopper
