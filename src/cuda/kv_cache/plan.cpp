// The fused KV-cache path's plan; see plan.hpp.
#include "cuda/kv_cache/plan.hpp"

#include <algorithm>

#include "cuda/fused/problem_args.hpp"

namespace gqattn::kv_cache {
namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::size_t smem_bytes(int d, int warps_m) {
  const std::size_t q = std::size_t(warps_m) * kRowsPerWarp * d * 2;
  const std::size_t kv = std::size_t(kStages) * 2 * kBlockN * d * 2;
  const std::size_t lse = std::size_t(kWarps) * kRowsPerWarp * sizeof(float);
  return q + kv + lse;
}

Plan plan(const Problem& p, DeviceShape device, bool batch_invariant) {
  Plan plan;
  plan.d = fused::kernel_head_dim(p.d);
  const int64_t group = p.H / p.Hkv;
  const int64_t rows = p.Tq * group;
  // Decoding (a few rows): the warps split each key tile; chunks: the rows.
  plan.warps_m = rows <= kRowsPerWarp ? 1 : rows <= 2 * kRowsPerWarp ? 2 : kWarps;
  plan.block_m = plan.warps_m * kRowsPerWarp;
  plan.m_tiles = ceil_div(rows, plan.block_m);
  plan.smem_bytes = smem_bytes(plan.d, plan.warps_m);
  // The most key tiles one CTA visits: the capacity, or under a window the
  // window plus the CTA's query span.
  int64_t keys = p.Tk;
  const int64_t span = std::min<int64_t>(p.Tq, plan.block_m);
  if (p.window > 0 && p.window < p.Tk) keys = std::min<int64_t>(p.Tk, p.window + span);
  const int64_t max_tiles = std::max<int64_t>(1, ceil_div(keys, kBlockN));
  int64_t splits = 1;
  if (batch_invariant) {
    plan.tiles_per_split = kInvariantTilesPerSplit;
    splits = ceil_div(max_tiles, kInvariantTilesPerSplit);
  } else if (device.multiprocessors > 0 && device.ctas_per_sm > 0) {
    const int64_t ctas = p.B * p.Hkv * plan.m_tiles;
    const int64_t wave = int64_t(device.multiprocessors) * device.ctas_per_sm;
    if (2 * ctas <= wave) {
      splits = std::min(wave / ctas, ceil_div(max_tiles, kMinTilesPerSplit));
    } else if (max_tiles > 2 * kInvariantTilesPerSplit &&
               ceil_div(max_tiles, kInvariantTilesPerSplit) <= kMaxSplits) {
      // A wave's worth of CTAs already: long sequences still split into
      // fixed runs, which balances mixed lengths and keeps more small-page
      // reads in flight (docs/decisions/kv-cache-kernel.md).
      plan.tiles_per_split = kInvariantTilesPerSplit;
      splits = ceil_div(max_tiles, kInvariantTilesPerSplit);
    }
  }
  // The batch-invariant count is not capped: a cap would tie a sequence's
  // split to the capacity of the batch it is served in.
  plan.num_splits = int(batch_invariant ? splits : std::clamp<int64_t>(splits, 1, kMaxSplits));
  if (plan.num_splits > 1)
    plan.workspace_floats = int64_t(plan.num_splits) * p.B * p.H * p.Tq * (plan.d + 1);
  return plan;
}

std::string describe(const Plan& plan, bool batch_invariant) {
  std::string s = "kv-cache split-KV kernel (mma.sync, paged loads): d" + std::to_string(plan.d) +
                  ", " + std::to_string(plan.block_m) + " packed rows per CTA, " +
                  (plan.warps_m == kWarps ? "warps split the rows"
                   : plan.warps_m == 1    ? "warps split each key tile"
                                          : "warps split rows and key tiles") +
                  ", ";
  if (plan.num_splits == 1) return s + "no split";
  s += std::to_string(plan.num_splits) + " splits";
  if (plan.tiles_per_split > 0)
    s += " of " + std::to_string(plan.tiles_per_split * kBlockN) + " keys";
  return s + (batch_invariant ? " (batch invariant)" : " (filling the GPU)");
}

}  // namespace gqattn::kv_cache
