// cuda-hopper's backward on varlen batches (Problem::varlen) against the f64
// oracle per sequence, through gqattn::check (packed tensors, NaN-poisoned
// gradients, a bitwise rerun), on what is cuda-hopper's own (docs/
// decisions/hopper-varlen-backward.md): key tiles past a sequence's keys
// (zeros up to seqused_k's packed rows), query tiles past its queries, the
// per-sequence workspace blocks, the fused dQ's ordered adds and its
// conversion per sequence, and the separate dQ kernel (forced through the
// plan override). Cases: GQA and MQA, seqused_k, empty and one-row
// sequences beside a long one, q_start below 0 and past Tk, window and
// softcap, d 64 / 128 / 256. Every case skips, saying why, where
// cuda-hopper cannot run it.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "api/plan_override.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;

constexpr uint64_t kSeed = 20261206;

struct VarlenBackwardCase {
  std::string name;
  Problem problem;  // varlen; Tq, Tk the longest lengths
  std::vector<int32_t> seqlens_q, seqlens_k, seqused_k;
  DType dtype = DType::bf16;
};

std::ostream& operator<<(std::ostream& os, const VarlenBackwardCase& c) { return os << c.name; }

std::string case_name(const ::testing::TestParamInfo<VarlenBackwardCase>& info) {
  return info.param.name;
}

int32_t longest(const std::vector<int32_t>& x) {
  int32_t m = 1;
  for (int32_t v : x) m = v > m ? v : m;
  return m;
}

VarlenBackwardCase make(std::string name, int64_t H, int64_t Hkv, int64_t d, bool causal,
                        int64_t window, std::vector<int32_t> q, std::vector<int32_t> k,
                        std::vector<int32_t> used = {}, DType dtype = DType::bf16,
                        float softcap = 0.0f) {
  VarlenBackwardCase c;
  c.name = std::move(name);
  c.problem = gqattn::make_problem(int64_t(q.size()), longest(q), longest(k), H, Hkv, d, causal,
                                   window, softcap);
  c.problem.varlen = true;
  c.seqlens_q = std::move(q);
  c.seqlens_k = std::move(k);
  c.seqused_k = std::move(used);
  c.dtype = dtype;
  return c;
}

std::vector<VarlenBackwardCase> cases() {
  std::vector<VarlenBackwardCase> out;
  for (int64_t d : {64, 128, 256}) {
    const std::string dn = "_d" + std::to_string(d);
    // A long sequence (many query and key tiles) beside empty and one-row
    // ones: most tiles of both grids lie past their sequence's rows.
    out.push_back(make("long_beside_empty_causal_gqa4" + dn, 8, 2, d, true, 0,
                       {0, 700, 0, 1, 0, 130, 1}, {5, 600, 0, 1, 0, 260, 40}));
    // Causal with Tq_b > Tk_b (rows without keys: zero dq) and lengths off
    // every tile.
    out.push_back(make("causal_tq_above_tk" + dn, 4, 4, d, true, 0, {300, 50, 129, 65},
                       {100, 10, 129, 200}, {}, DType::f16));
    // No mask, seqused_k below the packed keys: whole key tiles past
    // seqused_k store zeros, a sequence without used keys too.
    out.push_back(make("seqused_k_no_mask_mqa" + dn, 4, 1, d, false, 0, {200, 0, 50, 1},
                       {400, 10, 80, 3}, {150, 7, 0, 3}));
    // Sliding window with softcap, GQA.
    out.push_back(make("window100_softcap_gqa2" + dn, 4, 2, d, true, 100, {333, 17, 256},
                       {400, 17, 300}, {}, DType::bf16, 30.0f));
    // q_start below 0: the first rows of every sequence keep no key.
    VarlenBackwardCase neg =
        make("q_start_negative_causal" + dn, 4, 2, d, true, 0, {150, 3, 0, 300}, {100, 3, 4, 320});
    neg.problem.q_start = -20;
    out.push_back(neg);
    // q_start past Tk: causal keeps every key; with a window no row keeps
    // any of the short sequences' keys (their dk, dv, dq are zero).
    VarlenBackwardCase past =
        make("q_start_past_tk_causal" + dn, 4, 4, d, true, 0, {130, 64, 1}, {90, 300, 5});
    past.problem.q_start = 1000;
    out.push_back(past);
    VarlenBackwardCase past_window =
        make("q_start_past_tk_window" + dn, 4, 4, d, true, 50, {130, 64, 1}, {90, 1100, 5});
    past_window.problem.q_start = 1000;
    out.push_back(past_window);
  }
  return out;
}

// Runs case `c` forward and backward with the plan `force` forced, against
// the f64 oracle per sequence, and the backward again for bitwise
// repeatability. Skips, saying why, where cuda-hopper refuses it (the fused
// dQ at d 256).
void run_case(const VarlenBackwardCase& c, const char* force) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const gqattn::detail::ScopedPlanOverride scope(gqattn::detail::parse_plan_override(force));
  const gqattn::Explanation why = gqattn::explain(c.problem, c.dtype, Device::cuda,
                                                  Backend::CudaHopper, gqattn::Pass::backward);
  if (!why.supported) GTEST_SKIP() << why.reason;
  EXPECT_NE(why.plan.find("varlen"), std::string::npos) << why.plan;

  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = Backend::CudaHopper;
  config.seed = kSeed;
  config.backward = true;
  config.deterministic = true;
  config.determinism = true;
  config.varlen.seqlens_q = c.seqlens_q;
  config.varlen.seqlens_k = c.seqlens_k;
  config.varlen.seqused_k = c.seqused_k;
  const gqattn::check::Report report = gqattn::check::run(config);
  EXPECT_TRUE(report.ran) << report.skipped;
  EXPECT_EQ(report.backend, Backend::CudaHopper);
  EXPECT_TRUE(report.backward_skipped.empty()) << report.backward_skipped;
  std::string metrics;
  for (const gqattn::check::Metric& m : report.metrics)
    metrics += " " + m.name + " " + std::to_string(m.error) + "/" + std::to_string(m.tolerance) +
               (m.note.empty() ? "" : " (" + m.note + ")");
  EXPECT_TRUE(report.pass) << c.name << " [" << force << "]:" << metrics
                           << (report.deterministic ? "" : " [not bitwise reproducible]");
}

class HopperVarlenBackward : public ::testing::TestWithParam<VarlenBackwardCase> {};

// The plan's dQ path (fused with ordered adds where the rule picks it).
TEST_P(HopperVarlenBackward, Rule) { run_case(GetParam(), ""); }

// The fused dQ forced (d <= 128; d 256 skips): per-sequence accumulator
// blocks and their conversion.
TEST_P(HopperVarlenBackward, FusedDq) { run_case(GetParam(), "dq=fused"); }

// The separate dQ kernel: per-sequence query tiles and bounded stores.
TEST_P(HopperVarlenBackward, SeparateDq) { run_case(GetParam(), "dq=separate"); }

INSTANTIATE_TEST_SUITE_P(Batches, HopperVarlenBackward, ::testing::ValuesIn(cases()), case_name);

}  // namespace
