// cuda-flash: the forward launcher template: launches the kernel instance
// for the plan's element type and score mode, sets its shared memory,
// launches one CTA per (query tile, head, batch) on a 1-D grid (B*H may
// exceed grid.y's limit). A padded head dim (the plan's head_dim below kD)
// runs the padded instance, dense and varlen batches alike.
// Instantiated per head dimension by launch_forward_d*.cu. Checked through
// tests/gpu/test_flash_*.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "cuda/common/cuda_check.hpp"
#include "cuda/flash/forward_kernel.cuh"
#include "cuda/flash/launchers.hpp"
#include "cuda/fused/score_mode.hpp"
#include "gqattn/error.hpp"

namespace gqattn::flash {

template <int kD, typename Elem, fused::ScoreMode kScores>
void launch_forward_typed(const ForwardParams& p, bool padded, cudaStream_t stream) {
  using Tile = ForwardTile<kD>;
  constexpr int kThreads = Tile::kWarps * fused::kWarpSize;
  constexpr int kSmem = int(forward_smem_bytes<kD>());
  const int blocks = int(forward_blocks(kD, p.B, p.H, p.mask.tq));
  // The varlen instance only for a varlen batch, the padded one for every
  // batch of a padded head dim (forward_kernel.cuh).
  auto kernel = padded           ? forward_kernel<kD, Elem, kScores, true, true>
                : p.seq.varlen() ? forward_kernel<kD, Elem, kScores, true>
                                 : forward_kernel<kD, Elem, kScores, false>;
  GQATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kernel<<<blocks, kThreads, kSmem, stream>>>(p);
  cuda::check_launch("cuda-flash forward_kernel");
}

template <int kD, typename Elem>
void launch_forward_elem(const ForwardPlan& plan, const ForwardParams& p, cudaStream_t s) {
  const bool padded = plan.head_dim != kD;
  switch (plan.score_mode) {
    case fused::ScoreMode::plain:
      launch_forward_typed<kD, Elem, fused::ScoreMode::plain>(p, padded, s);
      break;
    case fused::ScoreMode::softcap:
      launch_forward_typed<kD, Elem, fused::ScoreMode::softcap>(p, padded, s);
      break;
    case fused::ScoreMode::softcap_without_row_max:
      // score_mode() gives this mode to bf16 only: no f16 kernel is compiled.
      if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
        launch_forward_typed<kD, Elem, fused::ScoreMode::softcap_without_row_max>(p, padded, s);
      else
        throw Error("cuda-flash forward", "internal: the no-row-max softcap kernels are bf16 only");
      break;
  }
}

template <int kD>
void launch_forward(const ForwardPlan& plan, const ForwardParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (plan.elem == fused::ElemType::bf16)
    launch_forward_elem<kD, __nv_bfloat16>(plan, p, s);
  else
    launch_forward_elem<kD, __half>(plan, p, s);
}

}  // namespace gqattn::flash
