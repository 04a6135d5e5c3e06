// cuda-hopper's backward (sm_90a: wgmma, TMA, warp specialisation; dK/dV
// and dQ kernels) against the f64 oracle through gqattn::check (tolerances
// of docs/semantics.md, NaN-poisoned gradients, determinism by rerunning and
// comparing bits): T = 1, T not a multiple of the tiles, Tq != Tk both ways,
// Hkv = 1 and H / Hkv in {1, 2, 4, 8, 32}, windows 1, 64 and >= T, softcap 30
// with large logits and with logits straddling the polynomial's range, rows with no kept key, key
// tiles no query sees, bf16 and f16, padded strides, causal and not, d 64, 128 and 256 (the dK/dV
// kernel splits the work by gradient, one consumer warpgroup handing P^T to
// the other every step, so one step and many; the dQ kernel walks 32-key
// tiles, so Tk not a multiple of 32 too), and sequences long enough to wrap
// the Q/dO and K/V rings several times; for d <= 128 both dQ paths, and
// the fused one also with Options::deterministic = false (which cuda-hopper
// runs with its ordered adds all the same); the dK/dV grid in groups of
// pairs. The dQ paths and the grid order are forced through the plan
// override (api/plan_override.hpp). Also: d = 256 is no longer refused;
// forcing a dQ path cuda-hopper cannot take (fused at d = 256, atomic) is
// refused before anything is written; a dk stride TMA cannot store sends
// all three gradients through the plain stores, which must give the bits
// of the staged TMA stores.
// Every case skips, saying why, where cuda-hopper's backward cannot run (no
// device, not sm_90, no sm_90a code in the build).
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "api/plan_override.hpp"
#include "attention_harness.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"
#include "oracle_cases.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Pass;
using gqattn::Problem;
using gqattn::detail::DqPath;
using gqattn::detail::PlanOverride;

constexpr uint64_t kSeed = 20261203;

using BackwardCase = gqattn::testing::OracleCase;
using gqattn::testing::case_name;
using gqattn::testing::describe;
using gqattn::testing::large_logits;
using gqattn::testing::make;
using gqattn::testing::straddling_poly_range;

std::vector<BackwardCase> cases() {
  const DType f16 = DType::f16;
  const DType bf16 = DType::bf16;
  return {
      // d = 128, bf16 first.
      make("T1_d128", 1, 1, 1, 2, 1, 128, false),
      make("T1_causal_d128_mha", 2, 1, 1, 2, 2, 128, true),
      make("T64_d128", 1, 64, 64, 1, 1, 128, false),
      make("T128_causal_d128", 1, 128, 128, 2, 1, 128, true),
      make("T200_d128_mha", 1, 200, 200, 4, 4, 128, false),
      make("T200_causal_d128_gqa4", 1, 200, 200, 8, 2, 128, true),
      make("T257_causal_d128_mqa8", 1, 257, 257, 8, 1, 128, true),
      // GQA 32 (and Hkv = 1): a kv head's dK/dV sums 32 query heads' tiles.
      make("T150_causal_d128_mqa32", 1, 150, 150, 32, 1, 128, true),
      make("B2_T130_window50_d128_gqa32", 2, 130, 130, 64, 2, 128, true, 50),
      make("T1000_causal_d128_gqa2", 1, 1000, 1000, 4, 2, 128, true),
      make("T700_d128_mqa", 2, 700, 700, 2, 1, 128, false),
      make("Tq37_Tk200_causal_d128", 1, 37, 200, 2, 1, 128, true),
      make("Tq200_Tk37_causal_d128_empty_rows", 1, 200, 37, 2, 2, 128, true),
      make("Tq90_Tk300_d128", 2, 90, 300, 2, 2, 128, false),
      make("Tq300_Tk90_d128_gqa4", 1, 300, 90, 4, 1, 128, false),
      make("T100_causal_window1_d128", 1, 100, 100, 2, 1, 128, true, 1),
      make("T200_causal_window_ge_T_d128", 1, 200, 200, 2, 2, 128, true, 500),
      make("T300_window64_d128", 1, 300, 300, 2, 1, 128, false, 64),
      make("T700_causal_window64_d128_gqa4", 1, 700, 700, 4, 1, 128, true, 64),
      make("Tq180_Tk70_causal_window40_d128_unseen_keys", 1, 180, 70, 2, 1, 128, true, 40),
      make("Tq70_Tk400_causal_window40_d128_unseen_keys", 1, 70, 400, 2, 1, 128, true, 40),
      large_logits(make("T160_causal_softcap30_d128", 1, 160, 160, 4, 2, 128, true, 0, 30.0f)),
      make("T150_softcap30_d128", 1, 150, 150, 2, 1, 128, false, 0, 30.0f),
      // Softcap logits straddling the polynomial r's range (backward softcap polynomial):
      // some warp tiles take it, others ex2 + rcp (the small-logit cases
      // take it everywhere, large_logits nowhere).
      straddling_poly_range(
          make("T600_causal_softcap30_d128_poly_mixed", 1, 600, 600, 4, 2, 128, true, 0, 30.0f)),
      straddling_poly_range(
          make("T300_causal_softcap30_d64_poly_mixed", 1, 300, 300, 4, 1, 64, true, 0, 30.0f)),
      straddling_poly_range(
          make("T200_causal_softcap30_d256_poly_mixed", 1, 200, 200, 2, 1, 256, true, 0, 30.0f)),
      make("T100_causal_d128_padded", 2, 100, 100, 4, 2, 128, true, 0, 0.0f, bf16, true),
      make("T200_d128_f16", 1, 200, 200, 2, 1, 128, false, 0, 0.0f, f16),
      make("T200_causal_window64_d128_f16", 1, 200, 200, 2, 1, 128, true, 64, 0.0f, f16),
      large_logits(
          make("T120_causal_softcap30_d128_f16", 1, 120, 120, 2, 1, 128, true, 0, 30.0f, f16)),
      make("Tq60_Tk90_d128_f16_padded", 1, 60, 90, 8, 1, 128, false, 0, 0.0f, f16, true),
      make("B5_H6_T65_causal_d128", 5, 65, 65, 6, 3, 128, true),
      // d = 64.
      make("T1_d64", 1, 1, 1, 2, 1, 64, false),
      make("T37_causal_d64_gqa2", 1, 37, 37, 4, 2, 64, true),
      make("T200_d64_mqa8", 1, 200, 200, 8, 1, 64, false),
      make("T90_d64_mqa32", 1, 90, 90, 32, 1, 64, false),
      make("Tq200_Tk37_causal_d64_empty_rows", 1, 200, 37, 2, 2, 64, true),
      make("Tq70_Tk180_causal_window40_d64", 1, 70, 180, 4, 2, 64, true, 40),
      large_logits(make("T96_softcap30_d64", 2, 96, 96, 2, 1, 64, false, 0, 30.0f)),
      make("T129_causal_d64_f16", 1, 129, 129, 4, 2, 64, true, 0, 0.0f, f16),
      make("T100_causal_d64_padded", 1, 100, 100, 4, 1, 64, true, 0, 0.0f, bf16, true),
      make("T900_causal_d64", 1, 900, 900, 2, 1, 64, true),
      // d = 256: in the dK/dV kernel both consumer warpgroups share 64 keys,
      // one forming dV and handing P^T to the other, which forms dK; the dQ
      // kernel keeps whole rows over 32-key tiles.
      make("T1_d256", 1, 1, 1, 2, 1, 256, false),
      make("T1_causal_d256_mha", 2, 1, 1, 2, 2, 256, true),
      make("T64_d256", 1, 64, 64, 1, 1, 256, false),
      make("T100_causal_d256_gqa2", 1, 100, 100, 4, 2, 256, true),
      make("T70_causal_d256_mqa32", 1, 70, 70, 32, 1, 256, true),
      make("T257_causal_d256_mqa4", 1, 257, 257, 4, 1, 256, true),
      make("T700_causal_d256_gqa2", 1, 700, 700, 4, 2, 256, true),
      make("Tq37_Tk200_causal_d256", 1, 37, 200, 2, 1, 256, true),
      make("Tq200_Tk37_causal_d256_empty_rows", 1, 200, 37, 2, 2, 256, true),
      make("Tq90_Tk300_d256", 2, 90, 300, 2, 2, 256, false),
      make("Tq300_Tk90_d256_gqa4", 1, 300, 90, 4, 1, 256, false),
      make("T100_causal_window1_d256", 1, 100, 100, 2, 1, 256, true, 1),
      make("T300_causal_window64_d256_gqa2", 1, 300, 300, 4, 2, 256, true, 64),
      make("Tq70_Tk400_causal_window40_d256_unseen_keys", 1, 70, 400, 2, 1, 256, true, 40),
      large_logits(make("T160_causal_softcap30_d256", 1, 160, 160, 4, 2, 256, true, 0, 30.0f)),
      make("T150_softcap30_d256", 1, 150, 150, 2, 1, 256, false, 0, 30.0f),
      // d = 256 under softcap (the hand-over carries P^T times the softcap
      // factor) on one step, on rows with no key, windowed f16 with Tq !=
      // Tk, padded MQA.
      make("T1_softcap30_d256", 1, 1, 1, 2, 1, 256, false, 0, 30.0f),
      make("Tq200_Tk37_causal_softcap30_d256_empty_rows", 1, 200, 37, 2, 2, 256, true, 0, 30.0f),
      large_logits(make("Tq90_Tk300_causal_window64_softcap50_d256_f16", 1, 90, 300, 4, 1, 256,
                        true, 64, 50.0f, f16)),
      make("T257_causal_softcap50_d256_mqa4_padded", 1, 257, 257, 4, 1, 256, true, 0, 50.0f, bf16,
           true),
      make("T100_causal_d256_padded", 2, 100, 100, 4, 2, 256, true, 0, 0.0f, bf16, true),
      make("T200_causal_window64_d256_f16", 1, 200, 200, 2, 1, 256, true, 64, 0.0f, f16),
      make("Tq60_Tk90_d256_f16_padded", 1, 60, 90, 8, 1, 256, false, 0, 0.0f, f16, true),
      // The forward's o at d256 comes from lazy rescaling at threshold 8
      // (hopper/tile_sizes.hpp): long rows keep stale reference maxima on
      // most key tiles, and an o whose 16-bit rounding of the largest p went
      // uncompensated fails dq / dk through D = rowsum(dO o O)
      // (Tq37_Tk200_causal_d256 did;
      // docs/decisions/hopper-forward-lazy-rescale.md). Scale 1: row
      // maxima that jump past the threshold late in a row.
      make("T1000_causal_d256_stale_maxima", 1, 1000, 1000, 2, 1, 256, true),
      make("Tq64_Tk1500_d256_f16_stale_maxima", 1, 64, 1500, 2, 1, 256, false, 0, 0.0f, f16),
      large_logits(make("T600_causal_d256_large_logits", 1, 600, 600, 2, 1, 256, true)),
  };
}

// The reason cuda-hopper cannot run `p`'s backward here, or "".
std::string why_not_backward(const Problem& p, DType dtype) {
  const gqattn::Explanation why =
      gqattn::explain(p, dtype, Device::cuda, Backend::CudaHopper, Pass::backward);
  return why.supported ? "" : why.reason;
}
std::string why_not_forward(const Problem& p, DType dtype) {
  const gqattn::Explanation why = gqattn::explain(p, dtype, Device::cuda, Backend::CudaHopper);
  return why.supported ? "" : why.reason;
}

class HopperBackwardVsOracle : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(HopperBackwardVsOracle, Backward) {
  const BackwardCase& c = GetParam();
  const std::string why = why_not_backward(c.problem, c.dtype);
  if (!why.empty()) GTEST_SKIP() << why;

  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = Backend::CudaHopper;
  config.seed = kSeed;
  config.backward = true;
  config.determinism = true;
  config.padded_strides = c.padded;
  const gqattn::check::Report report = gqattn::check::run(config);
  EXPECT_TRUE(report.ran) << report.skipped;
  EXPECT_EQ(report.backend, Backend::CudaHopper);
  EXPECT_TRUE(report.backward_skipped.empty()) << report.backward_skipped;
  EXPECT_TRUE(report.pass) << describe(report);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperBackwardVsOracle, ::testing::ValuesIn(cases()), case_name);

// d <= 128 has two dQ paths (backward_dq_choice.hpp); the cases above take
// the one the rule picks (mostly separate at these sizes), these force each.
std::vector<BackwardCase> fused_dq_cases() {
  std::vector<BackwardCase> out;
  for (const BackwardCase& c : cases())
    if (c.problem.d <= 128) out.push_back(c);
  return out;
}

// The plan override forcing dQ path `dq_path` (DqPath::rule: the rule's)
// and `dkdv_group_pairs` pairs a group of the dK/dV grid (-1: the rule's
// grid order).
PlanOverride forced(DqPath dq_path, int dkdv_group_pairs = -1) {
  PlanOverride force;
  force.dq_path = dq_path;
  force.dkdv_group_pairs = dkdv_group_pairs;
  return force;
}

// Runs case `c` with the plan `force` forced (dQ path, grid order) and
// Options::deterministic = `deterministic` and expects it to pass the
// oracle (and, when deterministic, the bitwise rerun); skips, saying why,
// where cuda-hopper's backward cannot run.
void expect_path_passes(const BackwardCase& c, const PlanOverride& force, bool deterministic) {
  const std::string why = why_not_backward(c.problem, c.dtype);
  if (!why.empty()) GTEST_SKIP() << why;
  const gqattn::detail::ScopedPlanOverride scope(force);
  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = Backend::CudaHopper;
  config.seed = kSeed + 1;
  config.backward = true;
  config.deterministic = deterministic;
  config.padded_strides = c.padded;
  const gqattn::check::Report report = gqattn::check::run(config);
  EXPECT_TRUE(report.ran) << report.skipped;
  EXPECT_TRUE(report.backward_skipped.empty()) << report.backward_skipped;
  EXPECT_TRUE(report.pass) << describe(report);
}

class HopperBackwardDqPaths : public ::testing::TestWithParam<BackwardCase> {};

// Fused dQ with its semaphore-ordered adds.
TEST_P(HopperBackwardDqPaths, FusedOrdered) {
  expect_path_passes(GetParam(), forced(DqPath::fused), true);
}

// The separate dQ kernel.
TEST_P(HopperBackwardDqPaths, Separate) {
  expect_path_passes(GetParam(), forced(DqPath::separate), true);
}

// Options::deterministic = false: cuda-hopper has no non-deterministic dQ
// (its ordered adds measured faster), so the fused path runs as ever and
// must still pass the oracle.
TEST_P(HopperBackwardDqPaths, FusedNondeterministicOption) {
  expect_path_passes(GetParam(), forced(DqPath::fused), false);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperBackwardDqPaths, ::testing::ValuesIn(fused_dq_cases()),
                         case_name);

// The dK/dV grid in groups of (batch, kv head) pairs (tile_order.hpp
// key_tile_id), which the rule takes only for long sequences and many pairs
// (backward_tile_sizes.hpp dkdv_group_pairs), forced here on the cases with
// two pairs or more and more than one key tile: one pair a group (every key
// tile of a pair before the next pair's), and three (a last group of fewer
// pairs where 3 does not divide them). d <= 128 through the fused dQ, whose
// ordered adds must not wait on a key tile dispatched later.
std::vector<BackwardCase> grouped_grid_cases() {
  std::vector<BackwardCase> out;
  for (const BackwardCase& c : cases())
    if (c.problem.B * c.problem.Hkv >= 2 && c.problem.Tk > 64) out.push_back(c);
  return out;
}

class HopperBackwardGroupedGrid : public ::testing::TestWithParam<BackwardCase> {};

// Fused dQ for d <= 128; d = 256 the rule's (separate, its only path).
PlanOverride grouped(const BackwardCase& c, int pairs) {
  return forced(c.problem.d <= 128 ? DqPath::fused : DqPath::rule, pairs);
}

TEST_P(HopperBackwardGroupedGrid, OnePairAGroup) {
  expect_path_passes(GetParam(), grouped(GetParam(), 1), true);
}

TEST_P(HopperBackwardGroupedGrid, ThreePairsAGroup) {
  expect_path_passes(GetParam(), grouped(GetParam(), 3), true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperBackwardGroupedGrid,
                         ::testing::ValuesIn(grouped_grid_cases()), case_name);

Problem d256_problem() {
  Problem p;
  p.B = 1;
  p.Tq = p.Tk = 100;
  p.H = 2;
  p.Hkv = 1;
  p.d = 256;
  p.causal = true;
  return p;
}

// d = 256 has a hopper backward now: not refused wherever the forward runs.
TEST(HopperBackwardSupport, D256Supported) {
  const Problem p = d256_problem();
  const std::string forward = why_not_forward(p, DType::bf16);
  if (!forward.empty()) GTEST_SKIP() << forward;
  EXPECT_EQ(why_not_backward(p, DType::bf16), "");
}

#ifdef GQATTN_WITH_CUDA
// A forced dQ path cuda-hopper cannot take is refused before anything is
// written, naming the forced field: the fused dQ at d = 256, and the atomic
// dQ (cuda-hopper's adds are always ordered), also on a call that allows
// it.
TEST(HopperBackwardSupport, ImpossibleForcedDqPathIsRefused) {
  const Problem p = d256_problem();
  const std::string why = why_not_backward(p, DType::bf16);
  if (!why.empty()) GTEST_SKIP() << why;
  const gqattn::Error fused = gqattn::test::backward_forced_error(
      p, Backend::CudaHopper, forced(DqPath::fused), /*deterministic=*/true);
  EXPECT_EQ(fused.argument(), "backend") << fused.what();
  EXPECT_NE(fused.rule().find(
                "cuda-hopper: dq=fused: not supported: cuda-hopper's fused dQ needs d <= 128"),
            std::string::npos)
      << fused.what();
  for (const bool deterministic : {true, false}) {
    const gqattn::Error atomic = gqattn::test::backward_forced_error(
        p, Backend::CudaHopper, forced(DqPath::atomic), deterministic);
    EXPECT_EQ(atomic.argument(), "backend") << atomic.what();
    EXPECT_NE(
        atomic.rule().find(
            "cuda-hopper: dq=atomic: not supported: cuda-hopper's dQ adds are always ordered"),
        std::string::npos)
        << atomic.what();
  }
}

// A dk row stride of Hkv*d + 2 elements (4-byte pieces, not 16-byte ones):
// TMA cannot store it, so dq, dk and dv all take the plain 32-bit stores
// instead of the staged TMA stores (every d); they must give the bits of the run
// with packed gradients (staged) and leave dk's gaps between rows alone.
// Every head dimension, each dQ path it has, causal, GQA 2, T not a
// multiple of the 64-row stores.
TEST(HopperBackwardOutput, StrideTmaCannotStoreGivesTheSameBits) {
  struct Run {
    int64_t d;
    DqPath dq_path;
  };
  for (const Run run : {Run{64, DqPath::fused}, Run{64, DqPath::separate}, Run{128, DqPath::fused},
                        Run{128, DqPath::separate}, Run{256, DqPath::separate}}) {
    Problem p = d256_problem();
    p.B = 2;
    p.Tq = p.Tk = 300;
    p.H = 4;
    p.Hkv = 2;
    p.d = run.d;
    const std::string why = why_not_backward(p, DType::bf16);
    if (!why.empty()) GTEST_SKIP() << why;
    const PlanOverride force = forced(run.dq_path);
    SCOPED_TRACE("d = " + std::to_string(run.d) + ", forced " + gqattn::detail::to_string(force));
    const gqattn::detail::ScopedPlanOverride scope(force);
    using gqattn::test::DeviceBuffer;
    const int64_t q_elems = p.B * p.Tq * p.H * p.d;
    const int64_t kv_elems = p.B * p.Tk * p.Hkv * p.d;
    constexpr std::size_t kElem = 2;
    DeviceBuffer q(q_elems * kElem), k(kv_elems * kElem), v(kv_elems * kElem), o(q_elems * kElem),
        dout(q_elems * kElem), dq(q_elems * kElem), dk(kv_elems * kElem), dv(kv_elems * kElem),
        lse(std::size_t(p.B * p.H * p.Tq) * sizeof(float));
    q.upload(gqattn::test::random_bf16(q_elems, kSeed));
    k.upload(gqattn::test::random_bf16(kv_elems, kSeed + 1));
    v.upload(gqattn::test::random_bf16(kv_elems, kSeed + 2));
    dout.upload(gqattn::test::random_bf16(q_elems, kSeed + 3));
    auto ref = [&](const DeviceBuffer& b, int64_t T, int64_t heads) {
      return gqattn::contiguous(b.get(), DType::bf16, Device::cuda, p.B, T, heads, p.d);
    };
    const gqattn::TensorRef lse_ref =
        gqattn::contiguous(lse.get(), DType::f32, Device::cuda, p.B, p.H, p.Tq);
    gqattn::Options options;
    options.backend = Backend::CudaHopper;
    gqattn::forward(p, ref(q, p.Tq, p.H), ref(k, p.Tk, p.Hkv), ref(v, p.Tk, p.Hkv),
                    ref(o, p.Tq, p.H), lse_ref, options);

    for (DeviceBuffer* b : {&dq, &dk, &dv}) b->poison();
    gqattn::backward(p, ref(q, p.Tq, p.H), ref(k, p.Tk, p.Hkv), ref(v, p.Tk, p.Hkv),
                     ref(o, p.Tq, p.H), lse_ref, ref(dout, p.Tq, p.H), ref(dq, p.Tq, p.H),
                     ref(dk, p.Tk, p.Hkv), ref(dv, p.Tk, p.Hkv), options);
    const std::vector<uint16_t> dq_packed = dq.download<uint16_t>();
    const std::vector<uint16_t> dk_packed = dk.download<uint16_t>();
    const std::vector<uint16_t> dv_packed = dv.download<uint16_t>();
    for (const std::vector<uint16_t>* g : {&dq_packed, &dk_packed, &dv_packed})
      for (uint16_t bits : *g)
        ASSERT_NE(bits, gqattn::test::kPoisonBits16) << "packed gradient not fully written";

    constexpr int64_t kPairGap = 2;
    const int64_t row = p.Hkv * p.d + kPairGap;
    DeviceBuffer dk_wide(std::size_t(p.B * p.Tk * row) * kElem);
    for (DeviceBuffer* b : {&dq, &dk_wide, &dv}) b->poison();
    gqattn::TensorRef dk_ref = ref(dk_wide, p.Tk, p.Hkv);
    dk_ref.stride[1] = row;
    dk_ref.stride[0] = row * p.Tk;
    gqattn::backward(p, ref(q, p.Tq, p.H), ref(k, p.Tk, p.Hkv), ref(v, p.Tk, p.Hkv),
                     ref(o, p.Tq, p.H), lse_ref, ref(dout, p.Tq, p.H), ref(dq, p.Tq, p.H), dk_ref,
                     ref(dv, p.Tk, p.Hkv), options);
    EXPECT_TRUE(dq.download<uint16_t>() == dq_packed) << "dq differs from the staged run";
    EXPECT_TRUE(dv.download<uint16_t>() == dv_packed) << "dv differs from the staged run";
    const gqattn::test::StridedComparison c = gqattn::test::compare_strided(
        dk_wide.download<uint16_t>(), dk_packed, p.B * p.Tk, p.Hkv * p.d, row);
    EXPECT_EQ(c.differing, 0) << "dk elements differing from the staged run";
    EXPECT_EQ(c.gap_written, 0) << "dk gap elements written";
  }
}
#endif

}  // namespace
