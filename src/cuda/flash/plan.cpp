// cuda-flash: the plans of plan.hpp. Every choice a call makes is here, by
// the rules of tile_sizes.hpp that hold their measurements.
#include "cuda/flash/plan.hpp"

#include <string>

#include "cuda/flash/launchers.hpp"
#include "cuda/fused/problem_args.hpp"

namespace gqattn::flash {
namespace {

fused::ElemType elem_of(DType dtype) {
  return dtype == DType::bf16 ? fused::ElemType::bf16 : fused::ElemType::f16;
}

DkdvTileSize dkdv_tile(int d, const DeviceLimits& device, detail::DkdvTileChoice force) {
  switch (force) {
    case detail::DkdvTileChoice::small: return clamp_dkdv_tile(d, DkdvTileSize::kSmall);
    case detail::DkdvTileChoice::smaller: return clamp_dkdv_tile(d, DkdvTileSize::kSmaller);
    case detail::DkdvTileChoice::rule: break;
  }
  return dkdv_tile_for_device(d, device.smem_per_block);
}

const char* tile_name(DkdvTileSize tile) {
  switch (tile) {
    case DkdvTileSize::kDefault: return "default";
    case DkdvTileSize::kSmall: return "small";
    case DkdvTileSize::kSmaller: return "smaller";
  }
  return "?";
}

const char* dq_name(DqStrategy dq) {
  switch (dq) {
    case DqStrategy::kSeparate: return "separate";
    case DqStrategy::kOrdered: return "fused (ordered adds)";
    case DqStrategy::kAtomic: return "fused (atomic adds, not deterministic)";
  }
  return "?";
}

// "d=96 on the d=128 kernels (zero-filled columns), " where the head dim is
// padded; else "".
template <class Plan>
std::string padded_note(const Plan& plan) {
  if (plan.head_dim == plan.d) return "";
  return "d=" + std::to_string(plan.head_dim) + " on the d=" + std::to_string(plan.d) +
         " kernels (zero-filled columns), ";
}

}  // namespace

ForwardPlan plan_forward(const Problem& p, DType dtype) {
  ForwardPlan plan;
  plan.d = fused::kernel_head_dim(p.d);
  plan.head_dim = int(p.d);
  plan.elem = elem_of(dtype);
  plan.score_mode = fused::score_mode(fused::score_args(p), plan.elem);
  plan.blocks = forward_blocks(plan.d, p.B, p.H, p.Tq);
  plan.varlen = p.varlen;
  return plan;
}

BackwardPlan plan_backward(const Problem& p, DType dtype, const DeviceLimits& device,
                           bool deterministic, const detail::PlanOverride& force, int64_t total_q) {
  BackwardPlan plan;
  plan.varlen = p.varlen;
  plan.d = fused::kernel_head_dim(p.d);  // every rule below is the kernels'
  plan.head_dim = int(p.d);
  plan.elem = elem_of(dtype);
  plan.softcap = p.softcap > 0;
  plan.tile = dkdv_tile(plan.d, device, force.dkdv_tile);
  switch (force.dq_path) {
    case detail::DqPath::rule:
      plan.dq = deterministic ? default_dq_strategy(plan.d, p.causal, p.Tk, plan.tile)
                              : DqStrategy::kAtomic;
      break;
    case detail::DqPath::fused: plan.dq = DqStrategy::kOrdered; break;
    case detail::DqPath::separate:
      plan.dq = DqStrategy::kSeparate;
      if (dkdv_fused_dq_only(plan.d, plan.tile))
        plan.forced =
            "dq=separate: not supported: cuda-flash's backward at d=" + std::to_string(plan.d) +
            " on its " + tile_name(plan.tile) + " dK/dV tile runs only the fused dQ paths";
      break;
    case detail::DqPath::atomic:
      plan.dq = DqStrategy::kAtomic;
      if (deterministic)
        plan.forced =
            "dq=atomic: cuda-flash's atomic dQ is not deterministic: it needs "
            "Options::deterministic = false";
      break;
  }
  // lse2 and D, [B*H, tq_padded] f32 each; a fused dQ's f32 accumulator
  // [B*H, tq_padded, d] (the kernels' d; columns past a padded head dim are
  // never copied to dq); the ordered dQ's counters (one int per row: at
  // least one per (b, h, query tile)). A varlen batch has H blocks of
  // varlen_workspace_rows instead (both dQ strategies address them through
  // fused::workspace_row).
  plan.tq_padded = fused::tq_padded(p.Tq);
  if (p.varlen)
    plan.rows =
        std::size_t(p.H * fused::varlen_workspace_rows(total_q >= 0 ? total_q : p.B * p.Tq, p.B));
  else
    plan.rows = std::size_t(p.B * p.H * plan.tq_padded);
  const bool fused_dq = plan.dq != DqStrategy::kSeparate;
  plan.accum_floats = fused_dq ? plan.rows * std::size_t(plan.d) : 0;
  plan.counters = plan.dq == DqStrategy::kOrdered ? plan.rows : 0;
  plan.workspace_bytes =
      (2 * plan.rows + plan.accum_floats) * sizeof(float) + plan.counters * sizeof(int);
  return plan;
}

std::string describe(const ForwardPlan& plan) {
  return std::string("forward ") + padded_note(plan) + (plan.varlen ? "varlen, " : "") +
         std::to_string(plan.blocks) + " query tiles, scores " +
         (plan.score_mode == fused::ScoreMode::plain     ? "plain"
          : plan.score_mode == fused::ScoreMode::softcap ? "softcap"
                                                         : "softcap without row maximum");
}

std::string describe(const BackwardPlan& plan) {
  return std::string("backward ") + padded_note(plan) + (plan.varlen ? "varlen, " : "") +
         "dK/dV tile " + tile_name(plan.tile) + ", dQ " + dq_name(plan.dq) + ", workspace " +
         std::to_string((plan.workspace_bytes + 1023) / 1024) + " KB";
}

}  // namespace gqattn::flash
