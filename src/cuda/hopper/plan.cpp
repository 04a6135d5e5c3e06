// cuda-hopper: the plans of plan.hpp. Every choice a call makes is here,
// each by the rule in the header that holds its measurements.
#include "cuda/hopper/plan.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "cuda/fused/problem_args.hpp"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/forward/pack_gqa.hpp"
#include "cuda/hopper/forward/split_kv.hpp"

namespace gqattn::hopper {

int64_t forward_blocks(int block_m, int64_t B, int64_t H, int64_t Tq) {
  return (Tq + block_m - 1) / block_m * B * H;
}

namespace {

// The fused dQ from this many mean kept keys per query row: below it the
// fused path's fixed costs (the accumulator's conversion pass, the first
// adds' queueing) outweigh the two GEMMs it saves
// (docs/decisions/hopper-backward-dq-path.md).
constexpr int64_t kFusedDqMinKeysPerRow = 1536;

constexpr int64_t kMaxGridX = std::numeric_limits<int>::max();

fused::ElemType elem_of(DType dtype) {
  return dtype == DType::bf16 ? fused::ElemType::bf16 : fused::ElemType::f16;
}

// Whether the forward's tile for (d, shape) multicasts K/V to a CTA pair.
bool multicast(int d, TileShape shape, bool softcap) {
  if (softcap) return false;  // multicast_tile<Tile, true>() is false for every tile
  if (d == 64)
    return shape == TileShape::kTall ? multicast_tile<ForwardTile<64, TileShape::kTall>, false>()
                                     : multicast_tile<ForwardTile<64>, false>();
  if (d == 128)
    return shape == TileShape::kWide ? multicast_tile<ForwardTile<128, TileShape::kWide>, false>()
                                     : multicast_tile<ForwardTile<128>, false>();
  return multicast_tile<ForwardTile<256>, false>();
}
static_assert(!multicast_tile<ForwardTile<128>, true>() && !multicast_tile<ForwardTile<64>, true>(),
              "multicast() assumes no softcap tile multicasts");

// The dQ path's rule: the fused dQ where the mean kept keys per query row
// reach kFusedDqMinKeysPerRow, and always under softcap (its
// recomputation is the dearer one).
bool fused_dq_rule(const Problem& p, int d) {
  if (!bwd::fused_dq_supported(d)) return false;
  return p.softcap > 0 || p.kept_pairs() >= kFusedDqMinKeysPerRow * p.Tq;
}

const char* shape_name(TileShape shape) {
  switch (shape) {
    case TileShape::kDefault: return "default";
    case TileShape::kWide: return "wide";
    case TileShape::kTall: return "tall";
  }
  return "?";
}

const char* score_name(fused::ScoreMode mode) {
  switch (mode) {
    case fused::ScoreMode::plain: return "plain";
    case fused::ScoreMode::softcap: return "softcap";
    case fused::ScoreMode::softcap_without_row_max: return "softcap without row maximum";
  }
  return "?";
}

// "d=96 on the d=128 kernel, " where the head dim is padded; else "".
template <class Plan>
std::string padded_note(const Plan& plan) {
  if (plan.head_dim == plan.d) return "";
  return "d=" + std::to_string(plan.head_dim) + " on the d=" + std::to_string(plan.d) +
         " kernel (zero-filled columns), ";
}

std::string kb(std::size_t bytes) { return std::to_string((bytes + 1023) / 1024) + " KB"; }

std::string why_too_little_smem(const char* pass, int d, std::size_t need,
                                const DeviceLimits& device) {
  if (device.smem_per_block == 0 || need <= device.smem_per_block) return "";
  return std::string("not supported: cuda-hopper") + pass + " d=" + std::to_string(d) + " needs " +
         std::to_string(need / 1024) + " KB of shared memory per block, the device allows " +
         std::to_string(device.smem_per_block / 1024) + " KB";
}

}  // namespace

ForwardPlan plan_forward(const Problem& p, DType dtype, const DeviceLimits& device,
                         const detail::PlanOverride& force) {
  ForwardPlan plan;
  plan.d = fused::kernel_head_dim(p.d);
  plan.head_dim = int(p.d);
  plan.elem = elem_of(dtype);
  const fused::MaskArgs mask = fused::mask_args(p);
  const fused::ScoreArgs score = fused::score_args(p);
  plan.score_mode = fused::score_mode(score, plan.elem);
  // Varlen: the default tile (its only varlen kernels, kept few), packed
  // GQA by max_seqlen_q (forward/tile_schedule.cuh
  // varlen_tile_coord), no multicast (kCluster 1 only): see
  // docs/decisions/hopper-varlen-forward.md.
  plan.varlen = p.varlen;
  plan.shape =
      p.varlen ? TileShape::kDefault
               : forward_shape(plan.d, mask.causal, mask.window, mask.tq, mask.tk, score.softcap);
  plan.tile = forward_tile_dims(plan.d, plan.shape);
  plan.pack_shift = pack_gqa_shift(plan.tile.block_m, p.Tq, p.H, p.Hkv);
  plan.tile_heads = plan.pack_shift > 0 ? p.Hkv : p.H;
  plan.work_tiles =
      forward_blocks(plan.tile.block_m, p.B, plan.tile_heads, p.Tq << plan.pack_shift);
  plan.key_tiles = (p.Tk + plan.tile.block_n - 1) / plan.tile.block_n;
  // Varlen: no split by the rule, whose count follows B and would make a
  // sequence's bits depend on its batch (docs/semantics.md, batch
  // invariance; docs/decisions/hopper-varlen-forward.md).
  plan.splits = force.forward_splits > 0 ? force.forward_splits
                : p.varlen               ? 1
                           : split_kv_rule(plan.work_tiles, plan.key_tiles, device.multiprocessors);
  // Clusters pair the two query heads of a kv head on one query tile: not
  // for split tasks (dealt split by split) nor packed tiles (one kv head
  // each, no partner).
  const bool pairs_of_heads = p.Hkv > 0 && (plan.tile_heads / p.Hkv) % kMulticastCtas == 0;
  if (!p.varlen && plan.splits == 1 && pairs_of_heads &&
      multicast(plan.d, plan.shape, score.softcap))
    plan.cluster_ctas = kMulticastCtas;
  if (plan.splits > 1) {
    plan.split_rows = std::size_t(plan.splits * p.B * p.H * p.Tq);
    plan.workspace_bytes = plan.split_rows * std::size_t(plan.d + 1) * sizeof(float);
  }
  return plan;
}

BackwardPlan plan_backward(const Problem& p, DType dtype, const DeviceLimits& device,
                           const detail::PlanOverride& force, int64_t total_q) {
  BackwardPlan plan;
  plan.d = fused::kernel_head_dim(p.d);
  plan.head_dim = int(p.d);
  const int64_t d = plan.d;  // every rule below is the kernel's
  plan.elem = elem_of(dtype);
  plan.softcap = p.softcap > 0;
  switch (force.dq_path) {
    case detail::DqPath::rule: plan.fused_dq = fused_dq_rule(p, plan.d); break;
    case detail::DqPath::separate: plan.fused_dq = false; break;
    case detail::DqPath::fused:
      plan.fused_dq = bwd::fused_dq_supported(plan.d);
      if (!plan.fused_dq)
        plan.forced = "dq=fused: not supported: cuda-hopper's fused dQ needs d <= 128 (got d=" +
                      std::to_string(p.d) + ")";
      break;
    case detail::DqPath::atomic:
      plan.forced = "dq=atomic: not supported: cuda-hopper's dQ adds are always ordered";
      break;
  }
  const int64_t pairs = p.B * p.Hkv;
  if (force.dkdv_group_pairs >= 0)
    plan.dkdv_group_pairs = force.dkdv_group_pairs;
  else if (pairs > 0)
    plan.dkdv_group_pairs = bwd::dkdv_group_pairs(
        int(pairs), int(bwd::dkdv_blocks(p.B, p.Hkv, p.Tk, d) / pairs), device.multiprocessors);
  plan.varlen = p.varlen;
  plan.tq_padded = fused::tq_padded(p.Tq);
  plan.rows = std::size_t(p.B * p.H * plan.tq_padded);
  // Varlen: H blocks of varlen_workspace_rows (fused/sequence.hpp), the
  // rows fused::backward_params gives each head.
  const int64_t head_rows =
      p.varlen ? fused::varlen_workspace_rows(total_q >= 0 ? total_q : p.B * p.Tq, p.B) : 0;
  if (p.varlen) plan.rows = std::size_t(p.H * head_rows);
  if (plan.fused_dq) {
    plan.accum_floats = p.varlen ? plan.rows * std::size_t(d)
                                 : bwd::fused_dq_accum_floats(p.B, p.H, plan.tq_padded, d);
    plan.semaphores = p.varlen ? bwd::fused_dq_varlen_semaphores(p.H, head_rows)
                               : bwd::fused_dq_semaphores(p.B, p.H, plan.tq_padded);
  }
  plan.workspace_bytes =
      (2 * plan.rows + plan.accum_floats) * sizeof(float) + plan.semaphores * sizeof(int);
  // Every launch either dQ path may make, so that the verdict does not
  // depend on the path.
  plan.largest_grid = std::max(
      {bwd::dkdv_blocks(p.B, p.Hkv, p.Tk, d), bwd::dq_blocks(p.B, p.H, p.Tq, d),
       bwd::ceil_div(p.B * p.H * plan.tq_padded, fused::kPreprocessRowsPerBlock),
       bwd::fused_dq_supported(plan.d) ? bwd::dq_convert_blocks(p.B, p.H, plan.tq_padded) : 0});
  plan.smem_bytes = bwd::head_dim_supported(d) ? bwd::backward_smem_bytes(d) : 0;
  return plan;
}

std::string why_not(const ForwardPlan& plan, const DeviceLimits& device) {
  if (!plan.forced.empty()) return plan.forced;
  if (plan.work_tiles > kMaxGridX)
    return "not supported: cuda-hopper needs at most 2^31-1 thread blocks (B*H*Tq too large: " +
           std::to_string(plan.work_tiles) + " blocks)";
  if (plan.work_tiles * plan.splits > kMaxGridX)
    return "not supported: " + std::to_string(plan.splits) + " splits of " +
           std::to_string(plan.work_tiles) + " work tiles exceed 2^31-1 tasks";
  return why_too_little_smem("", plan.d, plan.tile.smem_bytes, device);
}

std::string why_not(const BackwardPlan& plan, const DeviceLimits& device) {
  if (!plan.forced.empty()) return plan.forced;
  if (plan.largest_grid > kMaxGridX)
    return "not supported: cuda-hopper backward needs at most 2^31-1 thread blocks (" +
           std::to_string(plan.largest_grid) + " blocks)";
  return why_too_little_smem(" backward", plan.d, plan.smem_bytes, device);
}

std::string describe(const ForwardPlan& plan) {
  std::string out = std::string(plan.varlen ? "varlen " : "") + padded_note(plan) +
                    "forward tile " + std::to_string(plan.tile.block_m) + "x" +
                    std::to_string(plan.tile.block_n) + " (" + shape_name(plan.shape) + ", " +
                    kb(plan.tile.smem_bytes) + " shared), scores " + score_name(plan.score_mode);
  if (plan.pack_shift > 0)
    out += ", packed GQA (" + std::to_string(1 << plan.pack_shift) + " heads a tile)";
  out += ", " + std::to_string(plan.work_tiles) + " work tiles";
  if (plan.splits > 1)
    out += " x " + std::to_string(plan.splits) + " KV splits (workspace " +
           kb(plan.workspace_bytes) + ")";
  if (plan.cluster_ctas > 1) out += ", K/V multicast to CTA pairs";
  return out;
}

std::string describe(const BackwardPlan& plan) {
  std::string out = std::string(plan.varlen ? "varlen " : "") + padded_note(plan) + "backward dQ " +
                    (plan.fused_dq ? "fused (ordered adds)" : "separate");
  out += ", dK/dV grid ";
  out += plan.dkdv_group_pairs > 0
             ? "in groups of " + std::to_string(plan.dkdv_group_pairs) + " (batch, kv head) pairs"
             : std::string("key-tile major");
  out += ", workspace " + kb(plan.workspace_bytes);
  return out;
}

}  // namespace gqattn::hopper
