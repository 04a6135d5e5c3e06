// cuda-hopper: the forward launcher template: picks the kernel instance for
// the element type and softcap, opts in to its shared memory, and launches
// a 1-D grid of CTAs of kThreads: one per work tile (query tile, head,
// batch), or with kPersistentScheduler min(tiles, SMs) CTAs (one fits per
// SM: __launch_bounds__(kThreads, 1) and the shared memory) that loop.
// Instantiated per head dimension by launch_forward_d*.cu. Checked through
// tests/gpu/test_hopper_forward.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/hopper/forward_kernel.cuh"
#include "cuda/hopper/launchers.hpp"

namespace gqattn::hopper {

template <int kD, typename Elem, bool kSoftcap>
void launch_forward_typed(const ForwardParams& params, cudaStream_t stream) {
  constexpr int kSmem = int(forward_smem_bytes<kD>());
  ForwardParams p = params;
  // why_not refused more than 2^31 - 1 tiles.
  p.num_tiles = int(forward_blocks(kD, p.B, p.H, p.mask.tq));
  int blocks = p.num_tiles;
  if constexpr (kPersistentScheduler) {
    constexpr int kCtasPerSm = 1;
    blocks = std::min(blocks, kCtasPerSm * cuda::current_device_properties().multiprocessors);
  }
  if (blocks == 0) return;  // no work tile (B, H or Tq is 0)
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
