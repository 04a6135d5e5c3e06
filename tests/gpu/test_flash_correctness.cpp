// cuda-flash against the f64 oracle through gqattn::check (tolerances of
// docs/semantics.md, NaN-poisoned outputs, determinism by rerunning and
// comparing bits): the shapes that break kernels — T = 1, T not a multiple of
// any tile, Tq != Tk both ways, d 64/128/256, Hkv = 1, Hkv = H, H/Hkv = 4,
// windows 1, 64 and >= T, softcap with large logits (each softcap score mode
// of flash/score_mode.hpp), rows with no kept key, bf16 and f16, padded
// strides. Every case skips, saying why, where cuda-flash cannot run (no
// usable device, or too little shared memory).
// Every case runs with each dQ strategy (separate, fused in a fixed order
// and atomic, see src/cuda/flash/tile_sizes.hpp), forced through the plan
// override (dq=separate, dq=fused, dq=atomic), plus longer cases where
// many key tiles add into each query tile (the ordered path's counters).
// Separate and ordered are checked for bitwise determinism across runs;
// atomic (Options::deterministic = false) only against the oracle. Every
// case runs again on the small-shared-memory dK/dV tiles (dkdv_tile=small
// forced), which sm86 / sm89 (d64, d128) and sm80 (d256) devices take, and
// the d256 cases on d256's smaller tile (dkdv_tile=smaller forced, sm86 /
// sm89; fused dQ only).
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "api/plan_override.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"
#include "oracle_cases.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;
using gqattn::detail::DkdvTileChoice;
using gqattn::detail::DqPath;
using gqattn::detail::PlanOverride;

constexpr uint64_t kSeed = 20261201;

using FlashCase = gqattn::testing::OracleCase;
using gqattn::testing::case_name;
using gqattn::testing::describe;
using gqattn::testing::large_logits;
using gqattn::testing::make;

std::vector<FlashCase> cases() {
  const DType f16 = DType::f16;
  return {
      make("T1_d64", 1, 1, 1, 2, 1, 64, false),
      make("T1_causal_d128", 2, 1, 1, 2, 2, 128, true),
      make("T37_causal_d64_gqa2", 1, 37, 37, 4, 2, 64, true),
      make("T200_d128_mha", 1, 200, 200, 4, 4, 128, false),
      make("T130_causal_d256_mqa", 1, 130, 130, 4, 1, 256, true),
      make("Tq37_Tk200_causal_d128", 1, 37, 200, 2, 1, 128, true),
      make("Tq200_Tk37_causal_d64_empty_rows", 1, 200, 37, 2, 2, 64, true),
      make("Tq150_Tk20_causal_d256_empty_rows", 1, 150, 20, 2, 1, 256, true),
      make("Tq90_Tk300_d64", 2, 90, 300, 2, 2, 64, false),
      make("T150_d64_mqa8", 1, 150, 150, 8, 1, 64, false),
      make("T257_causal_d128_gqa4", 1, 257, 257, 8, 2, 128, true),
      make("T100_causal_window1_d64", 1, 100, 100, 2, 1, 64, true, 1),
      make("T200_causal_window_ge_T_d128", 1, 200, 200, 2, 2, 128, true, 500),
      make("T300_window64_d128", 1, 300, 300, 2, 1, 128, false, 64),
      make("T190_causal_window64_d256", 1, 190, 190, 2, 2, 256, true, 64),
      make("Tq70_Tk180_causal_window40_d64", 1, 70, 180, 4, 2, 64, true, 40),
      make("Tq180_Tk70_causal_window40_d128", 1, 180, 70, 2, 1, 128, true, 40),
      large_logits(make("T160_causal_softcap30_d128", 1, 160, 160, 4, 2, 128, true, 0, 30.0f)),
      large_logits(make("T96_softcap30_d64", 2, 96, 96, 2, 1, 64, false, 0, 30.0f)),
      large_logits(
          make("Tq100_Tk140_causal_w32_softcap50_d256", 1, 100, 140, 2, 1, 256, true, 32, 50.0f)),
      // Softcap score modes (flash/score_mode.hpp): bf16 with cap log2 e <=
      // 76 has no row maximum (the cap 20, 30 and 50 bf16 cases, cap 52 next
      // to the bound); bf16 with a larger cap (60) and f16 keep it.
      large_logits(make("T260_causal_softcap52_d128", 1, 260, 260, 4, 2, 128, true, 0, 52.0f)),
      large_logits(
          make("T200_causal_softcap60_d128_row_max", 1, 200, 200, 4, 2, 128, true, 0, 60.0f)),
      make("T300_causal_softcap30_d128_small_logits", 1, 300, 300, 4, 1, 128, true, 0, 30.0f),
      large_logits(
          make("Tq200_Tk37_causal_softcap20_d64_empty_rows", 1, 200, 37, 2, 1, 64, true, 0, 20.0f)),
      large_logits(make("T190_causal_softcap20_d256_gqa2", 1, 190, 190, 4, 2, 256, true, 0, 20.0f)),
      make("T129_causal_d64_f16", 1, 129, 129, 4, 2, 64, true, 0, 0.0f, f16),
      make("T200_window64_d128_f16", 1, 200, 200, 2, 1, 128, true, 64, 0.0f, f16),
      make("T70_d256_f16", 1, 70, 70, 2, 2, 256, false, 0, 0.0f, f16),
      large_logits(
          make("T120_causal_softcap30_d128_f16", 1, 120, 120, 2, 1, 128, true, 0, 30.0f, f16)),
      make("T100_causal_d128_padded", 2, 100, 100, 4, 2, 128, true, 0, 0.0f, DType::bf16, true),
      make("Tq60_Tk90_d64_f16_padded", 1, 60, 90, 2, 1, 64, false, 0, 0.0f, f16, true),
      make("T80_causal_w16_d256_padded", 1, 80, 80, 2, 1, 256, true, 16, 0.0f, DType::bf16, true),
      make("B5_H6_T65_causal_d64", 5, 65, 65, 6, 3, 64, true),
  };
}

// Long enough that each query tile is reached by several key tiles (ordered
// dQ: several CTAs add into it, in order) and CTAs outnumber one wave.
std::vector<FlashCase> long_cases() {
  return {
      make("T1100_causal_d128_gqa4", 1, 1100, 1100, 8, 2, 128, true),
      make("B2_T700_d64_gqa2", 2, 700, 700, 4, 2, 64, false),
      make("T900_causal_window200_d64", 1, 900, 900, 4, 1, 64, true, 200),
      make("Tq300_Tk1000_causal_window300_d128", 1, 300, 1000, 4, 2, 128, true, 300),
      make("Tq1000_Tk300_causal_d128_empty_rows", 1, 1000, 300, 2, 1, 128, true),
      large_logits(make("T600_causal_softcap50_d256", 1, 600, 600, 4, 2, 256, true, 0, 50.0f)),
      large_logits(make("T700_causal_softcap30_d128_gqa4", 1, 700, 700, 8, 2, 128, true, 0, 30.0f)),
      make("T520_window100_d256_f16", 1, 520, 520, 2, 1, 256, false, 100, 0.0f, DType::f16),
      // Scale 1 without softcap: row maxima that jump far past the lazy
      // rescaling's bound (flash/softmax.cuh) from one key tile to the next.
      large_logits(make("T700_causal_d128_large_logits", 1, 700, 700, 4, 2, 128, true)),
      large_logits(
          make("T500_d64_large_logits_f16", 1, 500, 500, 2, 1, 64, false, 0, 0.0f, DType::f16)),
      large_logits(make("T400_causal_d256_large_logits", 1, 400, 400, 2, 1, 256, true)),
  };
}

std::vector<FlashCase> all_cases() {
  std::vector<FlashCase> all = cases();
  for (const FlashCase& c : long_cases()) all.push_back(c);
  return all;
}

// The plan override forcing dQ strategy `dq` (DqPath::rule: the backend
// chooses) on dK/dV tile `tile` (DkdvTileChoice::rule: the largest the
// device holds).
PlanOverride forced(DqPath dq, DkdvTileChoice tile = DkdvTileChoice::rule) {
  PlanOverride force;
  force.dq_path = dq;
  force.dkdv_tile = tile;
  return force;
}

// Runs case `c` with the plan `force` forced; deterministic:
// Options::deterministic of the calls; when true the outputs are also
// compared bitwise with a second run's. Skips, saying why, where cuda-flash
// cannot run the case's forward; where it runs the backward unforced, a
// forced plan it refuses fails the case.
void run_case(const FlashCase& c, const PlanOverride& force, bool deterministic = true) {
  const gqattn::Explanation why =
      gqattn::explain(c.problem, c.dtype, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const bool backward_runs =
      gqattn::explain(c.problem, c.dtype, Device::cuda, Backend::CudaFlash, gqattn::Pass::backward)
          .supported;
  const gqattn::detail::ScopedPlanOverride scope(force);

  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = Backend::CudaFlash;
  config.seed = kSeed;
  config.backward = true;
  config.deterministic = deterministic;
  config.determinism = deterministic;
  config.padded_strides = c.padded;
  const gqattn::check::Report report = gqattn::check::run(config);
  EXPECT_TRUE(report.ran) << report.skipped;
  EXPECT_EQ(report.backend, Backend::CudaFlash);
  if (backward_runs) {
    EXPECT_TRUE(report.backward_skipped.empty()) << report.backward_skipped;
  }
  EXPECT_TRUE(report.pass) << describe(report);
}

class FlashVsOracle : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashVsOracle, SeparateDq) { run_case(GetParam(), forced(DqPath::separate)); }

TEST_P(FlashVsOracle, OrderedDq) { run_case(GetParam(), forced(DqPath::fused)); }

// Atomic dQ (not deterministic): the oracle's tolerances, no bitwise check.
TEST_P(FlashVsOracle, AtomicDq) {
  run_case(GetParam(), forced(DqPath::atomic), /*deterministic=*/false);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashVsOracle, ::testing::ValuesIn(all_cases()), case_name);

// The small-shared-memory dK/dV tiles (tile_sizes.hpp,
// use_small_smem_dkdv_tile: d64's 64-query tile, d128's 64 x 64 and d256's
// single-buffered tile), which devices with less shared memory per block
// than the default tiles need run; forced here so that a device with more
// runs them too.
class FlashSmallSmemTileVsOracle : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashSmallSmemTileVsOracle, SeparateDq) {
  run_case(GetParam(), forced(DqPath::separate, DkdvTileChoice::small));
}

TEST_P(FlashSmallSmemTileVsOracle, OrderedDq) {
  run_case(GetParam(), forced(DqPath::fused, DkdvTileChoice::small));
}

TEST_P(FlashSmallSmemTileVsOracle, AtomicDq) {
  run_case(GetParam(), forced(DqPath::atomic, DkdvTileChoice::small), /*deterministic=*/false);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashSmallSmemTileVsOracle, ::testing::ValuesIn(all_cases()),
                         case_name);

// d256's smaller dK/dV tile (32 keys x 64 queries, V in registers, tile_sizes.hpp), which
// sm86 / sm89 devices take; it runs only the fused dQ paths (the separate
// one is refused: test_flash_support.cpp).
std::vector<FlashCase> d256_cases() {
  std::vector<FlashCase> d256;
  for (const FlashCase& c : all_cases())
    if (c.problem.d == 256) d256.push_back(c);
  return d256;
}

class FlashSmallerSmemTileVsOracle : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashSmallerSmemTileVsOracle, OrderedDq) {
  run_case(GetParam(), forced(DqPath::fused, DkdvTileChoice::smaller));
}

TEST_P(FlashSmallerSmemTileVsOracle, AtomicDq) {
  run_case(GetParam(), forced(DqPath::atomic, DkdvTileChoice::smaller), /*deterministic=*/false);
}

// The dQ strategy not forced: the rule's on this tile (ordered).
TEST_P(FlashSmallerSmemTileVsOracle, DefaultDq) {
  run_case(GetParam(), forced(DqPath::rule, DkdvTileChoice::smaller));
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashSmallerSmemTileVsOracle, ::testing::ValuesIn(d256_cases()),
                         case_name);

// Options::deterministic = false with nothing forced: the backend picks
// its non-deterministic strategy (atomic) itself. One long case per d.
TEST(FlashNondeterministic, UnsetStrategyMeetsTheOracle) {
  for (const FlashCase& c : long_cases()) {
    if (c.name != "T1100_causal_d128_gqa4" && c.name != "T900_causal_window200_d64" &&
        c.name != "T600_causal_softcap50_d256")
      continue;
    SCOPED_TRACE(c.name);
    run_case(c, PlanOverride{}, /*deterministic=*/false);
  }
}

}  // namespace
