// cuda-hopper: the forward launcher template. It launches what the plan
// (plan.hpp) decided: the tile (plan.shape), the kernel instance for the
// element type and score mode, clusters of two CTAs where the plan
// multicasts K/V, and after a split forward the combine kernel. It decides
// nothing itself. The grid is persistent: min(tasks, SMs) CTAs (one fits
// per SM: __launch_bounds__(threads, 1) and the shared memory) loop over
// the tasks, so the producer loads the next tile while the consumers store
// the current one (docs/decisions/hopper-forward-persistent-grid.md);
// clustered, as many clusters as can be resident at once. The combine
// kernel is a programmatic dependent launch, so its launch latency hides
// under the forward's tail (docs/decisions/hopper-forward-split-kv.md).
// Instantiated per head dimension by forward/launch_d*.cu. Checked through
// tests/gpu/test_hopper_forward.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/hopper/dependent_launch.hpp"
#include "cuda/hopper/forward/kernel.cuh"
#include "cuda/hopper/forward/split_combine.cuh"
#include "cuda/hopper/launchers.hpp"
#include "cuda/hopper/plan.hpp"
#include "gqattn/error.hpp"

namespace gqattn::hopper {

template <class Tile, typename Elem, ScoreMode kScores, int kCluster, bool kVarlen = false>
void launch_forward_grid(const ForwardPlan& plan, const ForwardParams& params,
                         cudaStream_t stream) {
  constexpr int kSmem = int(forward_smem_bytes<Tile>());
  constexpr int kThreads = forward_threads<Tile>();
  ForwardParams p = params;
  // The plan's why_not refused more than 2^31 - 1 tasks. With clusters the
  // tile heads are even, so the task count is a multiple of kCluster.
  p.num_tiles = int(plan.work_tiles * plan.splits);
  if (p.num_tiles == 0) return;  // no work tile (B, H or Tq is 0)
  auto kernel = forward_kernel<Tile, Elem, kScores, kCluster, kVarlen>;
  GQATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  if constexpr (kCluster == 1) {
    const int blocks = std::min(p.num_tiles, cuda::current_device_properties().multiprocessors);
    kernel<<<blocks, kThreads, kSmem, stream>>>(p);
  } else {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kCluster;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    // A cluster's CTAs share a GPC, so fewer than SMs / kCluster may fit.
    const int clusters = cuda::max_active_clusters(reinterpret_cast<const void*>(kernel), kCluster,
                                                   kThreads, std::size_t(kSmem));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(std::min(p.num_tiles, clusters * kCluster)));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    GQATTN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
  }
  cuda::check_launch("cuda-hopper forward_kernel");
  if (p.num_splits > 1) {
    launch_dependent(forward_combine_kernel<Tile::kD, Elem, kVarlen>, unsigned(combine_blocks(p)),
                     kCombineThreads, 0, stream, /*overlap=*/true, p);
    cuda::check_launch("cuda-hopper forward_combine_kernel");
  }
}

template <class Tile, typename Elem, ScoreMode kScores>
void launch_forward_typed(const ForwardPlan& plan, const ForwardParams& p, cudaStream_t stream) {
  // Varlen: one CTA per cluster on the default tile (plan_forward).
  if constexpr (std::is_same_v<Tile, ForwardTile<Tile::kD>>) {
    if (plan.varlen) {
      launch_forward_grid<Tile, Elem, kScores, 1, /*kVarlen=*/true>(plan, p, stream);
      return;
    }
  }
  if constexpr (multicast_tile<Tile, fused::has_softcap(kScores)>()) {
    if (plan.cluster_ctas == kMulticastCtas) {
      launch_forward_grid<Tile, Elem, kScores, kMulticastCtas>(plan, p, stream);
      return;
    }
  }
  launch_forward_grid<Tile, Elem, kScores, 1>(plan, p, stream);
}

template <class Tile, ScoreMode kScores>
void launch_forward_elem(const ForwardPlan& plan, const ForwardParams& p, cudaStream_t s) {
  if constexpr (kScores == ScoreMode::softcap_without_row_max) {
    // score_mode() gives this mode to bf16 only: no f16 kernel is compiled.
    if (plan.elem != ElemType::bf16)
      throw Error("cuda-hopper forward", "internal: the no-row-max softcap kernels are bf16 only");
    launch_forward_typed<Tile, __nv_bfloat16, kScores>(plan, p, s);
  } else if (plan.elem == ElemType::bf16) {
    launch_forward_typed<Tile, __nv_bfloat16, kScores>(plan, p, s);
  } else {
    launch_forward_typed<Tile, __half, kScores>(plan, p, s);
  }
}

template <int kD, ScoreMode kScores>
void launch_forward_scores(const ForwardPlan& plan, const ForwardParams& p, cudaStream_t s) {
  constexpr bool kSoftcap = fused::has_softcap(kScores);
  if constexpr (has_tile(kD, TileShape::kTall, kSoftcap)) {
    if (plan.shape == TileShape::kTall) {
      launch_forward_elem<ForwardTile<kD, TileShape::kTall>, kScores>(plan, p, s);
      return;
    }
  }
  if constexpr (has_tile(kD, TileShape::kWide, kSoftcap)) {
    if (plan.shape == TileShape::kWide) {
      launch_forward_elem<ForwardTile<kD, TileShape::kWide>, kScores>(plan, p, s);
      return;
    }
  }
  if (plan.shape != TileShape::kDefault)
    throw Error("cuda-hopper forward", "internal: the plan's tile has no kernel");
  launch_forward_elem<ForwardTile<kD>, kScores>(plan, p, s);
}

template <int kD>
void launch_forward(const ForwardPlan& plan, const ForwardParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (plan.score_mode) {
    case ScoreMode::plain: launch_forward_scores<kD, ScoreMode::plain>(plan, p, s); break;
    case ScoreMode::softcap: launch_forward_scores<kD, ScoreMode::softcap>(plan, p, s); break;
    case ScoreMode::softcap_without_row_max:
      launch_forward_scores<kD, ScoreMode::softcap_without_row_max>(plan, p, s);
      break;
  }
}

}  // namespace gqattn::hopper
