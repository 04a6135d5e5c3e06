// cuda-flash: the plan of one call, decided once on the host from the
// problem, the dtype, the device and the caller's determinism: the forward's
// score mode and grid, the backward's dK/dV tile and dQ strategy, and the
// workspace, and the kernels' head dim (a padded head dim runs the next
// one's padded kernels). why_not, explain, the workspace request and the
// launchers read the plan; nothing re-derives it. Plain C++, so
// tests/cpu/test_flash_plan.cpp checks the plans of the benchmark shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/plan_override.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/flash/tile_sizes.hpp"
#include "cuda/fused/params.hpp"
#include "cuda/fused/score_mode.hpp"
#include "gqattn/types.hpp"

namespace gqattn::flash {

using cuda::DeviceLimits;

struct ForwardPlan {
  int d = 0;         // the kernels' head dim (fused::kernel_head_dim of the problem's)
  int head_dim = 0;  // the problem's: d, or less where it is padded to d
  fused::ElemType elem = fused::ElemType::bf16;
  fused::ScoreMode score_mode = fused::ScoreMode::plain;
  int64_t blocks = 0;   // one per (query tile, head, batch)
  bool varlen = false;  // varlen batch: Tq is the longest sequence's
};

struct BackwardPlan {
  int d = 0;         // the kernels' head dim (fused::kernel_head_dim of the problem's)
  int head_dim = 0;  // the problem's: d, or less where it is padded to d
  fused::ElemType elem = fused::ElemType::bf16;
  bool softcap = false;
  // The largest dK/dV tile the device's shared memory holds (or the forced one).
  DkdvTileSize tile = DkdvTileSize::kDefault;
  DqStrategy dq = DqStrategy::kSeparate;
  bool varlen = false;
  int64_t tq_padded = 0;
  // B * H * tq_padded; varlen: H * varlen_workspace_rows(total_q, B)
  // (fused/sequence.hpp), one block per head.
  std::size_t rows = 0;
  std::size_t accum_floats = 0;  // fused dQ (ordered or atomic): rows * d (the kernels')
  std::size_t counters = 0;      // ordered dQ: one int per row
  std::size_t workspace_bytes = 0;
  std::string forced;  // a forced field this call cannot honour: why
};

ForwardPlan plan_forward(const Problem& p, DType dtype);
// deterministic: Options::deterministic of the call (false allows the
// atomic dQ). total_q: a varlen batch's packed query rows (the q tensor's);
// where no tensor is known (describe_plan), B * Tq.
BackwardPlan plan_backward(const Problem& p, DType dtype, const DeviceLimits& device,
                           bool deterministic, const detail::PlanOverride& force,
                           int64_t total_q = -1);

std::string describe(const ForwardPlan& plan);
std::string describe(const BackwardPlan& plan);

}  // namespace gqattn::flash
