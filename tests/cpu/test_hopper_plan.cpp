// cuda-hopper's plans (src/cuda/hopper/plan.hpp), without a GPU: what the
// forward and backward of the benchmark shapes run with on an H200 (132
// SMs, 227 KB of shared memory per block), worked out by hand from the
// rules: tile shape, score mode, packed GQA, split-KV, K/V multicast, dQ
// path, dK/dV grid order and workspace; and that a forced field reaches the
// plan or is refused with its reason. Built where the CUDA backends are
// (the plan lives in the library's CUDA part); it needs no GPU.
#ifdef GQATTN_HAS_CUDA_HOPPER
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "api/plan_override.hpp"
#include "cuda/fused/problem_args.hpp"
#include "cuda/fused/sequence.hpp"
#include "cuda/hopper/forward/split_kv.hpp"
#include "cuda/hopper/plan.hpp"

namespace {

using gqattn::DType;
using gqattn::Problem;
using gqattn::detail::DqPath;
using gqattn::detail::PlanOverride;
using gqattn::fused::ScoreMode;
using gqattn::hopper::DeviceLimits;
using gqattn::hopper::ForwardPlan;
using gqattn::hopper::plan_backward;
using gqattn::hopper::plan_forward;
using gqattn::hopper::TileShape;

const DeviceLimits kH200{132, 227 * 1024};
const PlanOverride kRule{};

Problem shape(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t d, bool causal,
              int64_t window = 0, float softcap = 0.0f) {
  return gqattn::make_problem(B, Tq, Tk, H, Hkv, d, causal, window, softcap);
}

ForwardPlan forward(const Problem& p, DType dtype = DType::bf16) {
  return plan_forward(p, dtype, kH200, kRule);
}

TEST(HopperPlan, CausalD128RunsTheDefaultTileInClusters) {
  const ForwardPlan plan = forward(shape(4, 4096, 4096, 32, 8, 128, true));
  EXPECT_EQ(plan.shape, TileShape::kDefault);
  EXPECT_EQ(plan.tile.block_m, 128);
  EXPECT_EQ(plan.tile.block_n, 128);
  EXPECT_EQ(plan.score_mode, ScoreMode::plain);
  EXPECT_EQ(plan.pack_shift, 0);
  EXPECT_EQ(plan.work_tiles, 32 * 4 * 32);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.cluster_ctas, 2);  // four query heads per kv head: pairs share K/V
  EXPECT_EQ(plan.workspace_bytes, 0u);
  EXPECT_EQ(gqattn::hopper::why_not(plan, kH200), "");
}

// A head dim between the instantiated ones runs on the next one up, with
// the kernel's rules (tile, workspace) and the problem's d kept for the
// stores; explain says so.
TEST(HopperPlan, PaddedHeadDimsRunTheNextKernel) {
  for (const auto& [d, kernel] : {std::pair<int, int>{8, 64},
                                  {40, 64},
                                  {80, 128},
                                  {96, 128},
                                  {136, 256},
                                  {160, 256},
                                  {192, 256},
                                  {256, 256}}) {
    const Problem p = shape(2, 1000, 1000, 16, 4, d, true);
    const ForwardPlan fwd = forward(p);
    EXPECT_EQ(fwd.d, kernel) << d;
    EXPECT_EQ(fwd.head_dim, d);
    const ForwardPlan same = forward(shape(2, 1000, 1000, 16, 4, kernel, true));
    EXPECT_EQ(fwd.tile.block_m, same.tile.block_m) << d;
    EXPECT_EQ(fwd.tile.block_n, same.tile.block_n) << d;
    const auto bwd = plan_backward(p, DType::bf16, kH200, kRule);
    const auto bwd_same =
        plan_backward(shape(2, 1000, 1000, 16, 4, kernel, true), DType::bf16, kH200, kRule);
    EXPECT_EQ(bwd.d, kernel);
    EXPECT_EQ(bwd.head_dim, d);
    EXPECT_EQ(bwd.fused_dq, bwd_same.fused_dq) << d;
    EXPECT_EQ(bwd.workspace_bytes, bwd_same.workspace_bytes) << d;
    const std::string note =
        "d=" + std::to_string(d) + " on the d=" + std::to_string(kernel) + " kernel";
    EXPECT_EQ(gqattn::hopper::describe(fwd).find(note) != std::string::npos, d != kernel)
        << gqattn::hopper::describe(fwd);
    EXPECT_EQ(gqattn::hopper::describe(bwd).find(note) != std::string::npos, d != kernel);
  }
}

TEST(HopperPlan, HeadDimsOutsideThePaddedRuleAreRefusedNamingIt) {
  using gqattn::fused::why_not_fused_problem;
  for (const int d : {8, 96, 200, 256})
    EXPECT_EQ(why_not_fused_problem("cuda-hopper", shape(1, 64, 64, 2, 1, d, true), DType::bf16,
                                    gqattn::Device::cuda),
              "")
        << d;
  for (const int d : {4, 100, 264, 512}) {
    const std::string why = why_not_fused_problem("cuda-hopper", shape(1, 64, 64, 2, 1, d, true),
                                                  DType::bf16, gqattn::Device::cuda);
    EXPECT_NE(why.find("d <= 256, a multiple of 8"), std::string::npos) << why;
    EXPECT_NE(why.find("d=" + std::to_string(d)), std::string::npos) << why;
  }
}

TEST(HopperPlan, NonCausalD128RunsTheWideTile) {
  const ForwardPlan plan = forward(shape(4, 4096, 4096, 32, 8, 128, false));
  EXPECT_EQ(plan.shape, TileShape::kWide);
  EXPECT_EQ(plan.tile.block_n, 176);
  EXPECT_EQ(plan.cluster_ctas, 2);
}

TEST(HopperPlan, WindowAndSoftcapKeepTheDefaultTile) {
  const ForwardPlan window = forward(shape(4, 4096, 4096, 32, 8, 128, true, 1024));
  EXPECT_EQ(window.shape, TileShape::kDefault);
  EXPECT_EQ(window.cluster_ctas, 2);
  const ForwardPlan capped = forward(shape(4, 4096, 4096, 32, 8, 128, true, 0, 30.0f));
  EXPECT_EQ(capped.shape, TileShape::kDefault);
  EXPECT_EQ(capped.score_mode, ScoreMode::softcap_without_row_max);  // bf16, cap 30 <= 52.68
  EXPECT_EQ(capped.cluster_ctas, 1);                                 // no multicast under softcap
  EXPECT_EQ(forward(shape(4, 4096, 4096, 32, 8, 128, true, 0, 30.0f), DType::f16).score_mode,
            ScoreMode::softcap);  // f16's range keeps the row maximum
  EXPECT_EQ(forward(shape(4, 4096, 4096, 32, 8, 128, true, 0, 60.0f)).score_mode,
            ScoreMode::softcap);  // a cap above 52.68
  // A window of Tk or more is no window: the non-causal problem goes wide.
  EXPECT_EQ(forward(shape(4, 4096, 4096, 32, 8, 128, false, 4096)).shape, TileShape::kWide);
}

TEST(HopperPlan, D64TakesTheTallTileFromLongRows) {
  const ForwardPlan plan = forward(shape(4, 4096, 4096, 32, 8, 64, true));
  EXPECT_EQ(plan.shape, TileShape::kTall);
  EXPECT_EQ(plan.tile.block_m, 192);
  EXPECT_EQ(plan.work_tiles, 22 * 4 * 32);  // ceil(4096 / 192) query tiles
  EXPECT_EQ(plan.cluster_ctas, 1);          // one column block: nothing to multicast
  EXPECT_EQ(forward(shape(16, 512, 512, 32, 8, 64, true)).shape, TileShape::kDefault);
  EXPECT_EQ(forward(shape(4, 4096, 4096, 32, 8, 64, true, 1024)).shape, TileShape::kDefault);
}

TEST(HopperPlan, D256AndItsSoftcapWindowShape) {
  const ForwardPlan plan = forward(shape(4, 4096, 4096, 16, 8, 256, true));
  EXPECT_EQ(plan.shape, TileShape::kDefault);
  EXPECT_EQ(plan.tile.block_n, 64);
  EXPECT_EQ(plan.cluster_ctas, 1);
  const ForwardPlan gemma = forward(shape(2, 8192, 8192, 16, 8, 256, true, 4096, 50.0f));
  EXPECT_EQ(gemma.score_mode, ScoreMode::softcap_without_row_max);
  EXPECT_EQ(gemma.splits, 1);
}

TEST(HopperPlan, DecodingPacksHeadsAndSplitsKeys) {
  // B8 Tq1 Tk8k H32/8 d128, no mask: the wide tile (47 key tiles of 176),
  // four heads a tile (64 work tiles), two splits fill 128 of 132 SMs.
  const ForwardPlan plan = forward(shape(8, 1, 8192, 32, 8, 128, false));
  EXPECT_EQ(plan.shape, TileShape::kWide);
  EXPECT_EQ(plan.pack_shift, 2);
  EXPECT_EQ(plan.tile_heads, 8);
  EXPECT_EQ(plan.work_tiles, 64);
  EXPECT_EQ(plan.key_tiles, 47);
  EXPECT_EQ(plan.splits, 2);
  EXPECT_EQ(plan.cluster_ctas, 1);  // split tasks are never clustered
  EXPECT_EQ(plan.split_rows, 2u * 8 * 32 * 1);
  EXPECT_EQ(plan.workspace_bytes, plan.split_rows * (128 + 1) * sizeof(float));
  // B64: 512 work tiles fill the GPU, no split; a packed tile has no partner.
  const ForwardPlan wide_batch = forward(shape(64, 1, 8192, 32, 8, 128, false));
  EXPECT_EQ(wide_batch.splits, 1);
  EXPECT_EQ(wide_batch.cluster_ctas, 1);
  EXPECT_EQ(wide_batch.workspace_bytes, 0u);
  // MQA: 32 heads a tile, 8 work tiles, split by keys (47 / 4 = 11).
  const ForwardPlan mqa = forward(shape(8, 1, 8192, 32, 1, 128, false));
  EXPECT_EQ(mqa.pack_shift, 5);
  EXPECT_EQ(mqa.work_tiles, 8);
  EXPECT_EQ(mqa.splits, 11);
  // d64 decoding: the tall tile, packed, two splits.
  const ForwardPlan d64 = forward(shape(8, 1, 8192, 32, 8, 64, false));
  EXPECT_EQ(d64.shape, TileShape::kTall);
  EXPECT_EQ(d64.pack_shift, 2);
  EXPECT_EQ(d64.splits, 2);
}

TEST(HopperPlan, WithoutADeviceNothingIsSplit) {
  EXPECT_EQ(
      plan_forward(shape(8, 1, 8192, 32, 8, 128, false), DType::bf16, DeviceLimits{}, kRule).splits,
      1);
}

TEST(HopperPlan, ForcedSplitsReachThePlan) {
  PlanOverride force;
  force.forward_splits = 3;
  const ForwardPlan plan =
      plan_forward(shape(4, 4096, 4096, 32, 8, 128, true), DType::bf16, kH200, force);
  EXPECT_EQ(plan.splits, 3);
  EXPECT_EQ(plan.cluster_ctas, 1);
  EXPECT_EQ(plan.split_rows, 3u * 4 * 32 * 4096);
}

TEST(HopperPlan, TooManyTasksAreRefused) {
  PlanOverride force;
  force.forward_splits = 16;
  // 2^27 work tiles fit a grid; 16 splits of them do not.
  const Problem p = shape(1024, 16384, 128, 1024, 1024, 128, false);
  const ForwardPlan plan = plan_forward(p, DType::bf16, kH200, force);
  EXPECT_EQ(plan.work_tiles, int64_t{1} << 27);
  EXPECT_NE(gqattn::hopper::why_not(plan, kH200).find("exceed 2^31-1 tasks"), std::string::npos);
  EXPECT_EQ(gqattn::hopper::why_not(plan_forward(p, DType::bf16, kH200, kRule), kH200), "");
}

TEST(HopperPlan, BackwardDqPathFollowsKeptKeysPerRow) {
  // Causal T4k: 2048 kept keys per row on average, above 1536: fused.
  EXPECT_TRUE(
      plan_backward(shape(4, 4096, 4096, 32, 8, 128, true), DType::bf16, kH200, kRule).fused_dq);
  // Causal T1k (512 a row) and a 1024-key window: separate.
  EXPECT_FALSE(
      plan_backward(shape(16, 1024, 1024, 32, 8, 128, true), DType::bf16, kH200, kRule).fused_dq);
  EXPECT_FALSE(
      plan_backward(shape(4, 4096, 4096, 32, 8, 128, true, 1024), DType::bf16, kH200, kRule)
          .fused_dq);
  // Softcap always fuses where d allows; d256 never does.
  EXPECT_TRUE(
      plan_backward(shape(16, 1024, 1024, 32, 8, 128, true, 0, 30.0f), DType::bf16, kH200, kRule)
          .fused_dq);
  EXPECT_FALSE(
      plan_backward(shape(4, 4096, 4096, 16, 8, 256, true), DType::bf16, kH200, kRule).fused_dq);
}

TEST(HopperPlan, BackwardWorkspaceAndGridOrder) {
  const Problem p = shape(4, 4096, 4096, 32, 8, 128, true);
  const auto plan = plan_backward(p, DType::bf16, kH200, kRule);
  EXPECT_EQ(plan.tq_padded, 4096);
  EXPECT_EQ(plan.rows, 4u * 32 * 4096);
  EXPECT_EQ(plan.accum_floats, plan.rows * 128);
  EXPECT_EQ(plan.semaphores, 4u * 32 * (4096 / 64));  // one per 64-row query tile
  EXPECT_EQ(plan.workspace_bytes,
            (2 * plan.rows + plan.accum_floats) * sizeof(float) + plan.semaphores * sizeof(int));
  // 32 (batch, kv head) pairs of 32 key tiles: the fewest pairs dividing 32
  // that hold 1.5 waves of 132 SMs (2 x pairs x 32 >= 3 x 132) is 8.
  EXPECT_EQ(plan.dkdv_group_pairs, 8);
  const auto separate =
      plan_backward(shape(16, 1024, 1024, 32, 8, 128, true), DType::bf16, kH200, kRule);
  EXPECT_EQ(separate.accum_floats, 0u);
  EXPECT_EQ(separate.workspace_bytes, 2 * separate.rows * sizeof(float));
}

TEST(HopperPlan, ForcedDqPathAndGroupReachThePlanOrAreRefused) {
  const Problem p = shape(16, 1024, 1024, 32, 8, 128, true);
  PlanOverride force;
  force.dq_path = DqPath::fused;
  force.dkdv_group_pairs = 0;
  const auto fused = plan_backward(p, DType::bf16, kH200, force);
  EXPECT_TRUE(fused.fused_dq);
  EXPECT_EQ(fused.dkdv_group_pairs, 0);
  EXPECT_EQ(gqattn::hopper::why_not(fused, kH200), "");
  const auto d256 =
      plan_backward(shape(4, 4096, 4096, 16, 8, 256, true), DType::bf16, kH200, force);
  EXPECT_NE(gqattn::hopper::why_not(d256, kH200).find("dq=fused: not supported"),
            std::string::npos);
  force.dq_path = DqPath::atomic;
  EXPECT_NE(gqattn::hopper::why_not(plan_backward(p, DType::bf16, kH200, force), kH200)
                .find("always ordered"),
            std::string::npos);
}

// A varlen batch (Tq, Tk the longest lengths): the default tile (its only
// varlen kernels), never clustered; packed GQA by the same rule as dense,
// and no split-KV unless forced (the rule's count follows B, which would
// break batch invariance; docs/decisions/hopper-varlen-forward.md).
TEST(HopperPlan, VarlenRunsTheDefaultTileUnclustered) {
  Problem causal = shape(4, 4096, 4096, 32, 8, 128, true);
  causal.varlen = true;
  const ForwardPlan plan = forward(causal);
  EXPECT_TRUE(plan.varlen);
  EXPECT_EQ(plan.shape, TileShape::kDefault);
  EXPECT_EQ(plan.work_tiles, 32 * 4 * 32);  // over max_seqlen_q: the empty tiles are skipped
  EXPECT_EQ(plan.cluster_ctas, 1);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(gqattn::hopper::why_not(plan, kH200), "");
  EXPECT_EQ(gqattn::hopper::describe(plan).rfind("varlen forward tile 128x128", 0), 0u)
      << gqattn::hopper::describe(plan);
  EXPECT_EQ(
      gqattn::hopper::describe(forward(shape(4, 4096, 4096, 32, 8, 128, true))).find("varlen"),
      std::string::npos);

  // Decoding: d128 without mask keeps the default tile (not the wide one),
  // packs four heads a tile (64 work tiles) and does not split the 64 key
  // tiles (a dense batch of this shape would).
  Problem decode = shape(8, 1, 8192, 32, 8, 128, false);
  decode.varlen = true;
  const ForwardPlan d = forward(decode);
  EXPECT_EQ(d.shape, TileShape::kDefault);
  EXPECT_EQ(d.pack_shift, 2);
  EXPECT_EQ(d.work_tiles, 64);
  EXPECT_EQ(d.key_tiles, 64);
  EXPECT_EQ(d.splits, 1);
  EXPECT_GT(gqattn::hopper::split_kv_rule(64, 64, 132), 1);

  // d64 long keys: not the tall tile.
  Problem d64 = shape(2, 4096, 4096, 8, 8, 64, false);
  d64.varlen = true;
  EXPECT_EQ(forward(d64).shape, TileShape::kDefault);

  // A forced split count reaches a varlen plan too.
  PlanOverride force;
  force.forward_splits = 3;
  const ForwardPlan forced = plan_forward(causal, DType::bf16, kH200, force);
  EXPECT_EQ(forced.splits, 3);
  EXPECT_EQ(forced.cluster_ctas, 1);
  EXPECT_EQ(gqattn::hopper::why_not(forced, kH200), "");
}

// A varlen backward: per-head workspace blocks of varlen_workspace_rows
// (total_q from the packed tensors, or B * Tq without them), the fused
// dQ's accumulator and semaphores over the same rows
// (docs/decisions/hopper-varlen-backward.md).
TEST(HopperPlan, VarlenBackwardSizesItsWorkspaceByPackedRows) {
  Problem p = shape(4, 1000, 1000, 32, 8, 128, true);
  p.varlen = true;
  const int64_t total_q = 2500;
  const auto plan = plan_backward(p, DType::bf16, kH200, kRule, total_q);
  const int64_t head_rows = gqattn::fused::varlen_workspace_rows(total_q, 4);
  EXPECT_TRUE(plan.varlen);
  EXPECT_EQ(plan.rows, std::size_t(32 * head_rows));
  if (plan.fused_dq) {
    EXPECT_EQ(plan.accum_floats, plan.rows * 128);
    EXPECT_EQ(plan.semaphores, std::size_t(32 * head_rows / 64));
  }
  EXPECT_EQ(plan_backward(p, DType::bf16, kH200, kRule).rows,
            std::size_t(32 * gqattn::fused::varlen_workspace_rows(4 * 1000, 4)));
  EXPECT_EQ(gqattn::hopper::why_not(plan, kH200), "");
  EXPECT_EQ(gqattn::hopper::describe(plan).rfind("varlen backward", 0), 0u)
      << gqattn::hopper::describe(plan);
  PlanOverride force;
  force.dq_path = DqPath::separate;
  const auto separate = plan_backward(p, DType::bf16, kH200, force, total_q);
  EXPECT_FALSE(separate.fused_dq);
  EXPECT_EQ(separate.accum_floats, 0u);
  EXPECT_EQ(separate.rows, plan.rows);
}

TEST(HopperPlan, DescriptionNamesWhatRuns) {
  const std::string text = gqattn::hopper::describe(forward(shape(8, 1, 8192, 32, 8, 128, false)));
  EXPECT_NE(text.find("128x176"), std::string::npos) << text;
  EXPECT_NE(text.find("2 KV splits"), std::string::npos) << text;
  EXPECT_NE(text.find("4 heads a tile"), std::string::npos) << text;
}

}  // namespace
#endif  // GQATTN_HAS_CUDA_HOPPER
