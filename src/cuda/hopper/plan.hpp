// cuda-hopper: the plan of one call, decided once on the host from the
// problem, the dtype and the device: which tile and score mode the forward
// runs, how its work is split and clustered, which dQ path and grid order
// the backward takes, and the workspace each needs. why_not, explain, the
// TMA maps, the workspace request and the launchers all read the plan;
// nothing re-derives it. Plain C++ (no device code), so
// tests/cpu/test_hopper_plan.cpp checks the plans of the benchmark shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/plan_override.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/fused/params.hpp"
#include "cuda/fused/score_mode.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "gqattn/types.hpp"

namespace gqattn::hopper {

using cuda::DeviceLimits;

struct ForwardPlan {
  int d = 0;         // the kernel's head dim (fused::kernel_head_dim of the problem's)
  int head_dim = 0;  // the problem's: d, or less where it is padded to d
  fused::ElemType elem = fused::ElemType::bf16;
  fused::ScoreMode score_mode = fused::ScoreMode::plain;
  TileShape shape = TileShape::kDefault;
  ForwardTileDims tile;
  // A varlen batch (docs/decisions/hopper-varlen-forward.md): the default
  // tile, one CTA per cluster.
  bool varlen = false;
  // Packed GQA (forward/pack_gqa.hpp): a tile holds 2^pack_shift query
  // heads of one kv head; 0: one head per tile.
  int pack_shift = 0;
  int64_t tile_heads = 0;  // heads the work tiles run over: H, or Hkv when packed
  int64_t work_tiles = 0;  // query tiles x B x tile_heads
  int64_t key_tiles = 0;
  int splits = 1;        // split-KV tasks per work tile (forward/split_kv.hpp)
  int cluster_ctas = 1;  // 2: K/V multicast to two CTAs of a cluster
  // Split-KV partials: f32 [splits][B][H][Tq] x (d + 1); 0 when not split.
  std::size_t split_rows = 0;
  std::size_t workspace_bytes = 0;
  std::string forced;  // a forced field the backend cannot honour: why
};

struct BackwardPlan {
  int d = 0;         // the kernel's head dim (fused::kernel_head_dim of the problem's)
  int head_dim = 0;  // the problem's: d, or less where it is padded to d
  fused::ElemType elem = fused::ElemType::bf16;
  bool softcap = false;
  // dK/dV kernel adds dQ into an f32 accumulator in a fixed order (true), or
  // the separate dQ kernel (false).
  bool fused_dq = false;
  // (batch, kv head) pairs per group of the dK/dV grid; 0: key-tile major.
  int dkdv_group_pairs = 0;
  // A varlen batch: packed rows, workspace blocks per sequence
  // (docs/decisions/hopper-varlen-backward.md).
  bool varlen = false;
  int64_t tq_padded = 0;  // query rows of each (b, h) workspace row
  std::size_t rows = 0;   // B * H * tq_padded; varlen: H * varlen_workspace_rows
  std::size_t accum_floats = 0;
  std::size_t semaphores = 0;
  std::size_t workspace_bytes = 0;  // lse2, D, and the fused dQ's buffers
  int64_t largest_grid = 0;         // thread blocks of the largest launch
  std::size_t smem_bytes = 0;       // of the larger kernel
  std::string forced;
};

// Work tiles of query tiles of block_m rows over B x H heads of Tq rows.
int64_t forward_blocks(int block_m, int64_t B, int64_t H, int64_t Tq);

ForwardPlan plan_forward(const Problem& p, DType dtype, const DeviceLimits& device,
                         const detail::PlanOverride& force);
// total_q: a varlen batch's packed query rows (the workspace's size); -1
// where no tensor is at hand: B * Tq, at least as many.
BackwardPlan plan_backward(const Problem& p, DType dtype, const DeviceLimits& device,
                           const detail::PlanOverride& force, int64_t total_q = -1);

// "" when the plan runs within the grid's and (if known) the device's
// shared-memory limits; else one line saying why not.
std::string why_not(const ForwardPlan& plan, const DeviceLimits& device);
std::string why_not(const BackwardPlan& plan, const DeviceLimits& device);

// One line for explain(): what runs and why.
std::string describe(const ForwardPlan& plan);
std::string describe(const BackwardPlan& plan);

}  // namespace gqattn::hopper
