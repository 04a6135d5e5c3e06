// cuda-flash's plans (src/cuda/flash/plan.hpp), without a GPU: the dK/dV
// tile and dQ strategy of the benchmark shapes on an H200 (227 KB of shared
// memory per block) and on a device with 99 KB (sm86 / sm89), the
// non-deterministic path, the workspace, padded head dims planned as their
// kernels', and forced fields reaching the plan or being refused with their
// reason. Built where the CUDA backends
// are (the plan lives in the library's CUDA part); it needs no GPU.
#ifdef GQATTN_HAS_CUDA_FLASH
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "api/plan_override.hpp"
#include "cuda/flash/launchers.hpp"
#include "cuda/flash/plan.hpp"
#include "cuda/fused/sequence.hpp"

namespace {

using gqattn::DType;
using gqattn::Problem;
using gqattn::detail::DkdvTileChoice;
using gqattn::detail::DqPath;
using gqattn::detail::PlanOverride;
using gqattn::flash::BackwardPlan;
using gqattn::flash::DeviceLimits;
using gqattn::flash::DkdvTileSize;
using gqattn::flash::DqStrategy;
using gqattn::flash::plan_backward;

const DeviceLimits kH200{132, 227 * 1024};
const DeviceLimits kSm89{128, 99 * 1024};
const PlanOverride kRule{};

Problem shape(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t d, bool causal,
              float softcap = 0.0f) {
  return gqattn::make_problem(B, T, T, H, Hkv, d, causal, 0, softcap);
}

BackwardPlan backward(const Problem& p, const DeviceLimits& device = kH200,
                      bool deterministic = true, const PlanOverride& force = kRule) {
  return plan_backward(p, DType::bf16, device, deterministic, force);
}

TEST(FlashPlan, H200RunsTheDefaultTileWithTheOrderedDqWhereItWon) {
  for (int64_t d : {64, 128, 256})
    EXPECT_EQ(backward(shape(4, 4096, 32, 8, d, true)).tile, DkdvTileSize::kDefault) << d;
  EXPECT_EQ(backward(shape(4, 4096, 32, 8, 128, true)).dq, DqStrategy::kOrdered);
  EXPECT_EQ(backward(shape(16, 1024, 32, 8, 128, true)).dq, DqStrategy::kOrdered);
  EXPECT_EQ(backward(shape(4, 4096, 32, 8, 64, true)).dq, DqStrategy::kOrdered);
  // d256: ordered from 2048 keys causal, 8192 not.
  EXPECT_EQ(backward(shape(4, 4096, 16, 8, 256, true)).dq, DqStrategy::kOrdered);
  EXPECT_EQ(backward(shape(16, 1024, 16, 8, 256, true)).dq, DqStrategy::kSeparate);
  EXPECT_EQ(backward(shape(4, 4096, 16, 8, 256, false)).dq, DqStrategy::kSeparate);
  EXPECT_EQ(backward(shape(1, 16384, 16, 8, 256, false)).dq, DqStrategy::kOrdered);
}

TEST(FlashPlan, NonDeterministicCallsTakeTheAtomicDq) {
  EXPECT_EQ(backward(shape(4, 4096, 32, 8, 128, true), kH200, false).dq, DqStrategy::kAtomic);
  EXPECT_EQ(backward(shape(4, 4096, 16, 8, 256, false), kH200, false).dq, DqStrategy::kAtomic);
}

TEST(FlashPlan, SmallSharedMemoryTakesASmallerTileThatFits) {
  for (int d : {64, 128, 256}) {
    const BackwardPlan plan = backward(shape(4, 4096, 16, 8, d, true), kSm89);
    EXPECT_LE(gqattn::flash::dkdv_max_smem_bytes(d, plan.tile), kSm89.smem_per_block) << d;
    EXPECT_TRUE(plan.forced.empty()) << plan.forced;
  }
  EXPECT_NE(backward(shape(4, 4096, 16, 8, 256, true), kSm89).tile, DkdvTileSize::kDefault);
}

TEST(FlashPlan, WorkspaceFollowsTheDqStrategy) {
  const Problem p = shape(2, 1000, 4, 2, 64, true);  // Tq padded to 1024
  const BackwardPlan ordered = backward(p);
  EXPECT_EQ(ordered.tq_padded, 1024);
  EXPECT_EQ(ordered.rows, 2u * 4 * 1024);
  EXPECT_EQ(ordered.accum_floats, ordered.rows * 64);
  EXPECT_EQ(ordered.counters, ordered.rows);
  EXPECT_EQ(ordered.workspace_bytes, (2 * ordered.rows + ordered.accum_floats) * sizeof(float) +
                                         ordered.counters * sizeof(int));
  const BackwardPlan atomic = backward(p, kH200, false);
  EXPECT_EQ(atomic.counters, 0u);
  EXPECT_EQ(atomic.accum_floats, atomic.rows * 64);
  PlanOverride force;
  force.dq_path = DqPath::separate;
  const BackwardPlan separate = backward(p, kH200, true, force);
  EXPECT_EQ(separate.dq, DqStrategy::kSeparate);
  EXPECT_EQ(separate.workspace_bytes, 2 * separate.rows * sizeof(float));
}

// A varlen batch: one workspace block of varlen_workspace_rows(total_q, B)
// rows per head (fused/sequence.hpp), whatever the dQ strategy; without a
// tensor (describe_plan) total_q is taken as B * Tq.
TEST(FlashPlan, VarlenWorkspaceIsOneBlockPerHead) {
  Problem p = shape(3, 1000, 4, 2, 64, true);
  p.varlen = true;
  const int64_t total_q = 1500;
  const std::size_t rows = std::size_t(4 * gqattn::fused::varlen_workspace_rows(total_q, 3));
  for (bool deterministic : {true, false}) {
    const BackwardPlan plan = plan_backward(p, DType::bf16, kH200, deterministic, kRule, total_q);
    EXPECT_TRUE(plan.varlen);
    EXPECT_EQ(plan.rows, rows);
    EXPECT_EQ(plan.accum_floats, plan.dq == DqStrategy::kSeparate ? 0 : rows * 64);
    EXPECT_EQ(plan.counters, plan.dq == DqStrategy::kOrdered ? rows : 0u);
    EXPECT_EQ(plan.rows % gqattn::fused::kWorkspaceRowAlign, 0u);
    EXPECT_NE(gqattn::flash::describe(plan).find("varlen"), std::string::npos);
  }
  EXPECT_EQ(backward(p).rows, std::size_t(4 * gqattn::fused::varlen_workspace_rows(3 * 1000, 3)));
  EXPECT_NE(gqattn::flash::describe(gqattn::flash::plan_forward(p, DType::bf16)).find("varlen"),
            std::string::npos);
  p.varlen = false;
  EXPECT_EQ(gqattn::flash::describe(backward(p)).find("varlen"), std::string::npos);
}

TEST(FlashPlan, ForcedFieldsReachThePlanOrAreRefused) {
  const Problem d256 = shape(4, 4096, 16, 8, 256, true);
  PlanOverride force;
  force.dkdv_tile = DkdvTileChoice::smaller;
  force.dq_path = DqPath::separate;
  const BackwardPlan smaller = backward(d256, kH200, true, force);
  EXPECT_EQ(smaller.tile, DkdvTileSize::kSmaller);
  EXPECT_NE(smaller.forced.find("dq=separate: not supported"), std::string::npos) << smaller.forced;
  // d64 has no "smaller" tile: its smallest is taken.
  force.dq_path = DqPath::rule;
  EXPECT_EQ(backward(shape(4, 4096, 16, 8, 64, true), kH200, true, force).tile,
            gqattn::flash::smallest_dkdv_tile(64));
  force = PlanOverride{};
  force.dq_path = DqPath::atomic;
  EXPECT_NE(backward(d256, kH200, true, force).forced.find("not deterministic"), std::string::npos);
  EXPECT_EQ(backward(d256, kH200, false, force).forced, "");
  force.dq_path = DqPath::fused;
  EXPECT_EQ(backward(shape(4, 4096, 16, 8, 256, false), kH200, true, force).dq,
            DqStrategy::kOrdered);
}

// A padded head dim plans as its kernels' (fused::kernel_head_dim): the same
// grid, tile, dQ strategy and workspace (the fused dQ's accumulator has the
// kernels' columns), on both devices, and says so in its description.
TEST(FlashPlan, PaddedHeadDimsPlanAsTheirKernels) {
  for (const auto& [d, kernel] : {std::pair{8, 64},
                                  {40, 64},
                                  {64, 64},
                                  {80, 128},
                                  {96, 128},
                                  {128, 128},
                                  {136, 256},
                                  {160, 256},
                                  {192, 256},
                                  {256, 256}}) {
    for (const DeviceLimits& device : {kH200, kSm89}) {
      const Problem p = shape(2, 1000, 16, 4, d, true);
      const Problem same = shape(2, 1000, 16, 4, kernel, true);
      const auto fwd = gqattn::flash::plan_forward(p, DType::bf16);
      EXPECT_EQ(fwd.d, kernel) << d;
      EXPECT_EQ(fwd.head_dim, d);
      EXPECT_EQ(fwd.blocks, gqattn::flash::plan_forward(same, DType::bf16).blocks) << d;
      const BackwardPlan bwd = backward(p, device);
      const BackwardPlan bwd_same = backward(same, device);
      EXPECT_EQ(bwd.d, kernel) << d;
      EXPECT_EQ(bwd.head_dim, d);
      EXPECT_EQ(bwd.tile, bwd_same.tile) << d;
      EXPECT_EQ(bwd.dq, bwd_same.dq) << d;
      EXPECT_EQ(bwd.workspace_bytes, bwd_same.workspace_bytes) << d;
      PlanOverride force;
      force.dq_path = DqPath::fused;
      const BackwardPlan fused = backward(p, device, true, force);
      EXPECT_EQ(fused.accum_floats, fused.rows * std::size_t(kernel)) << d;
      const std::string note =
          "d=" + std::to_string(d) + " on the d=" + std::to_string(kernel) + " kernels";
      EXPECT_EQ(gqattn::flash::describe(fwd).find(note) != std::string::npos, d != kernel)
          << gqattn::flash::describe(fwd);
      EXPECT_EQ(gqattn::flash::describe(bwd).find(note) != std::string::npos, d != kernel)
          << gqattn::flash::describe(bwd);
    }
  }
}

TEST(FlashPlan, ForwardScoreModeAndDescription) {
  const auto plan =
      gqattn::flash::plan_forward(shape(4, 4096, 32, 8, 128, true, 30.0f), DType::bf16);
  EXPECT_EQ(plan.score_mode, gqattn::fused::ScoreMode::softcap_without_row_max);
  EXPECT_EQ(plan.blocks, gqattn::flash::forward_blocks(128, 4, 32, 4096));
  EXPECT_NE(gqattn::flash::describe(backward(shape(4, 4096, 32, 8, 128, true))).find("ordered"),
            std::string::npos);
}

}  // namespace
#endif  // GQATTN_HAS_CUDA_FLASH
