// cuda-hopper: the forward launcher template: picks the tile (the wide d128
// tile or the tall d64 tile when forward_shape() says so, else the head
// dimension's default), the kernel instance for the element type and
// ScoreMode (flash/score_mode.hpp: plain, softcap, or bf16 softcap without
// row maximum), opts in to its shared memory, and launches a 1-D grid of
// CTAs of forward_threads(): one per work tile (query tile, head, batch),
// or with kPersistentScheduler min(tiles, SMs) CTAs (one fits per SM:
// __launch_bounds__(threads, 1) and the shared memory) that loop; with K/V
// multicast (forward_cluster_ctas() 2) the CTAs come in clusters of two, as
// many as can be resident at once. Instantiated per head dimension by
// launch_forward_d*.cu. The host side (hopper_backend.cpp) built the Q and
// K/V maps with the same tile's box rows. Split-KV (p.num_splits > 1,
// split_kv.hpp): num_splits tasks per work tile, never in clusters, then
// forward_combine_kernel merges their partials into o and lse.
// Checked through tests/gpu/test_hopper_forward.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/hopper/dependent_launch.hpp"
#include "cuda/hopper/forward/kernel.cuh"
#include "cuda/hopper/forward/split_combine.cuh"
#include "cuda/hopper/forward/split_kv.hpp"
#include "cuda/hopper/launchers.hpp"
#include "gqattn/error.hpp"

namespace gqattn::hopper {

// The grid for clusters of kCluster CTAs (1: plain CTAs) and the launch.
template <class Tile, typename Elem, ScoreMode kScores, int kCluster>
void launch_forward_grid(const ForwardParams& params, cudaStream_t stream) {
  constexpr int kSmem = int(forward_smem_bytes<Tile>());
  constexpr int kThreads = forward_threads<Tile>();
  ForwardParams p = params;
  // why_not refused more than 2^31 - 1 tiles (packing only lowers the
  // count). With clusters H is even, so the tile count is a multiple of
  // kCluster. Packed (pack_gqa.hpp): tiles of kBlockM packed rows over the
  // Tq << pack_shift rows of each kv head.
  p.num_tiles =
      int(forward_blocks(Tile::kBlockM, p.B, tile_heads(p), int64_t(p.mask.tq) << p.pack_shift)) *
      p.num_splits;
  if (p.num_tiles == 0) return;  // no work tile (B, H or Tq is 0)
  auto kernel = forward_kernel<Tile, Elem, kScores, kCluster>;
  GQATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  if constexpr (kCluster == 1) {
    int blocks = p.num_tiles;
    if constexpr (kPersistentScheduler) {
      constexpr int kCtasPerSm = 1;
      blocks = std::min(blocks, kCtasPerSm * cuda::current_device_properties().multiprocessors);
    }
    kernel<<<blocks, kThreads, kSmem, stream>>>(p);
  } else {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kCluster;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(p.num_tiles));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    if constexpr (kPersistentScheduler) {
      // As many clusters as fit at once (a cluster's CTAs share a GPC, so
      // this can be fewer than SMs / kCluster).
      const int clusters = cuda::max_active_clusters(reinterpret_cast<const void*>(kernel),
                                                     kCluster, kThreads, std::size_t(kSmem));
      config.gridDim = dim3(unsigned(std::min(p.num_tiles, clusters * kCluster)));
    }
    GQATTN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
  }
  cuda::check_launch("cuda-hopper forward_kernel");
  if (p.num_splits > 1) {
    // With kCombineOverlap, a programmatic dependent launch: launched while
    // the forward runs, it waits for it on the device, so the launch's
    // latency hides under the forward's tail.
    launch_dependent(forward_combine_kernel<Tile::kD, Elem>, unsigned(combine_blocks(p)),
                     kCombineThreads, 0, stream, kCombineOverlap, p);
    cuda::check_launch("cuda-hopper forward_combine_kernel");
  }
}

template <class Tile, typename Elem, ScoreMode kScores>
void launch_forward_typed(const ForwardParams& p, cudaStream_t stream) {
  constexpr bool kSoftcap = fused::has_softcap(kScores);
  if constexpr (multicast_tile<Tile, kSoftcap>()) {
    // A packed tile holds all heads of its kv head: no partner to share
    // K/V with (tile_heads / Hkv is 1). Split-KV tasks are dealt split by
    // split, not in pairs of heads: no clusters either.
    if (p.num_splits == 1 &&
        forward_cluster_ctas<Tile, kSoftcap>(tile_heads(p), p.Hkv) == kMulticastCtas) {
      launch_forward_grid<Tile, Elem, kScores, kMulticastCtas>(p, stream);
      return;
    }
  }
  launch_forward_grid<Tile, Elem, kScores, 1>(p, stream);
}

template <class Tile, ScoreMode kScores>
void launch_forward_elem(const ForwardParams& p, ElemType elem, cudaStream_t s) {
  if constexpr (kScores == ScoreMode::softcap_without_row_max) {
    // score_mode() gives this mode to bf16 only: no f16 kernel is compiled.
    if (elem != ElemType::bf16)
      throw Error("cuda-hopper forward", "internal: the no-row-max softcap kernels are bf16 only");
    launch_forward_typed<Tile, __nv_bfloat16, kScores>(p, s);
  } else if (elem == ElemType::bf16) {
    launch_forward_typed<Tile, __nv_bfloat16, kScores>(p, s);
  } else {
    launch_forward_typed<Tile, __half, kScores>(p, s);
  }
}

template <int kD, ScoreMode kScores>
void launch_forward_scores(const ForwardParams& p, ElemType elem, cudaStream_t s) {
  constexpr bool kSoftcap = fused::has_softcap(kScores);
  const TileShape shape =
      forward_shape(kD, p.mask.causal, p.mask.window, p.mask.tq, p.mask.tk, kSoftcap);
  if constexpr (has_tile(kD, TileShape::kTall, kSoftcap)) {
    if (shape == TileShape::kTall) {
      launch_forward_elem<ForwardTile<kD, TileShape::kTall>, kScores>(p, elem, s);
      return;
    }
  }
  if constexpr (has_tile(kD, TileShape::kWide, kSoftcap)) {
    if (shape == TileShape::kWide) {
      launch_forward_elem<ForwardTile<kD, TileShape::kWide>, kScores>(p, elem, s);
      return;
    }
  }
  launch_forward_elem<ForwardTile<kD>, kScores>(p, elem, s);
}

template <int kD>
void launch_forward(const ForwardParams& p, ElemType elem, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (fused::score_mode(p.score, elem)) {
    case ScoreMode::plain: launch_forward_scores<kD, ScoreMode::plain>(p, elem, s); break;
    case ScoreMode::softcap: launch_forward_scores<kD, ScoreMode::softcap>(p, elem, s); break;
    case ScoreMode::softcap_without_row_max:
      if constexpr (fused::kSoftcapWithoutRowMax)
        launch_forward_scores<kD, ScoreMode::softcap_without_row_max>(p, elem, s);
      else  // score_mode() never picks a switched-off mode
        throw Error("cuda-hopper forward", "internal: the no-row-max softcap kernels are off");
      break;
  }
}

}  // namespace gqattn::hopper
