// cuda-flash on varlen batches (Problem::varlen) against the f64 oracle per
// sequence, through gqattn::check (packed tensors, NaN-poisoned outputs,
// tolerances of docs/semantics.md, bitwise reruns where deterministic), on
// what is cuda-flash's own: every dQ strategy (separate, fused in a fixed
// order, atomic with Options::deterministic = false) forced through the
// plan override, on the default dK/dV tile and on the small-shared-memory
// ones (small; d256's smaller, fused dQ only). The batches put a sequence of
// several query and key tiles next to empty ones (no queries, no keys,
// neither), use seqused_k below the packed keys (the dK/dV kernel's zero
// rows, over a whole key tile too) and an explicit q_start (rows without
// keys: dq = 0). The backend-independent varlen cases (every backend, exact
// zeros, guard bytes, batch invariance, wrong offsets) are
// tests/gpu/test_varlen.cpp's. Every case skips, saying why, where
// cuda-flash cannot run it.
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
using gqattn::detail::DkdvTileChoice;
using gqattn::detail::DqPath;
using gqattn::detail::PlanOverride;

constexpr uint64_t kSeed = 20261205;

struct VarlenFlashCase {
  std::string name;
  Problem problem;  // varlen; Tq, Tk the longest lengths
  std::vector<int32_t> seqlens_q, seqlens_k, seqused_k;
  DType dtype = DType::bf16;
};

std::ostream& operator<<(std::ostream& os, const VarlenFlashCase& c) { return os << c.name; }

std::string case_name(const ::testing::TestParamInfo<VarlenFlashCase>& info) {
  return info.param.name;
}

int32_t longest(const std::vector<int32_t>& x) {
  int32_t m = 1;
  for (int32_t v : x) m = v > m ? v : m;
  return m;
}

VarlenFlashCase make(std::string name, int64_t H, int64_t Hkv, int64_t d, bool causal,
                     int64_t window, std::vector<int32_t> q, std::vector<int32_t> k,
                     std::vector<int32_t> used = {}, DType dtype = DType::bf16) {
  VarlenFlashCase c;
  c.name = std::move(name);
  c.problem = gqattn::make_problem(int64_t(q.size()), longest(q), longest(k), H, Hkv, d, causal,
                                   window, 0.0f);
  c.problem.varlen = true;
  c.seqlens_q = std::move(q);
  c.seqlens_k = std::move(k);
  c.seqused_k = std::move(used);
  c.dtype = dtype;
  return c;
}

std::vector<VarlenFlashCase> cases() {
  std::vector<VarlenFlashCase> out;
  for (int64_t d : {64, 128, 256}) {
    const std::string dn = "_d" + std::to_string(d);
    // A sequence of several query and key tiles (of every kernel) between
    // empty ones: no queries, no keys, neither.
    out.push_back(make("long_beside_empty_causal_gqa4_2" + dn, 4, 2, d, true, 0,
                       {0, 700, 0, 3, 0, 130}, {5, 650, 0, 0, 0, 260}));
    // seqused_k below the packed keys, by more than a key tile (whole key
    // tiles of zeros), and a sequence without queries whose keys are used.
    out.push_back(make("seqused_k_window64_mqa" + dn, 4, 1, d, false, 64, {200, 0, 50, 1},
                       {400, 10, 80, 3}, {150, 7, 0, 3}));
    // An explicit q_start below 0: the first rows of every sequence keep no
    // key under the causal mask (dq = 0 there).
    VarlenFlashCase c = make("q_start_negative_causal_gqa2" + dn, 4, 2, d, true, 0,
                             {150, 3, 0, 300}, {100, 3, 4, 320}, {}, DType::f16);
    c.problem.q_start = -20;
    out.push_back(c);
  }
  return out;
}

PlanOverride forced(DqPath dq, DkdvTileChoice tile = DkdvTileChoice::rule) {
  PlanOverride force;
  force.dq_path = dq;
  force.dkdv_tile = tile;
  return force;
}

// Runs case `c` with the plan `force` forced (deterministic: Options::
// deterministic, and then a bitwise rerun too). Skips, saying why, where
// cuda-flash refuses the forward, or the backward under this forced plan
// (d256's smaller tile has no separate dQ: test_flash_support.cpp).
void run_case(const VarlenFlashCase& c, const PlanOverride& force, bool deterministic = true) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const gqattn::Explanation why =
      gqattn::explain(c.problem, c.dtype, Device::cuda, Backend::CudaFlash);
  if (!why.supported) GTEST_SKIP() << why.reason;
  const gqattn::detail::ScopedPlanOverride scope(force);
  const gqattn::Explanation backward =
      gqattn::explain(c.problem, c.dtype, Device::cuda, Backend::CudaFlash, gqattn::Pass::backward);
  if (!backward.supported) GTEST_SKIP() << backward.reason;
  EXPECT_NE(backward.plan.find("varlen"), std::string::npos) << backward.plan;

  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = Backend::CudaFlash;
  config.seed = kSeed;
  config.backward = true;
  config.deterministic = deterministic;
  config.determinism = deterministic;
  config.varlen.seqlens_q = c.seqlens_q;
  config.varlen.seqlens_k = c.seqlens_k;
  config.varlen.seqused_k = c.seqused_k;
  const gqattn::check::Report report = gqattn::check::run(config);
  EXPECT_TRUE(report.ran) << report.skipped;
  EXPECT_EQ(report.backend, Backend::CudaFlash);
  EXPECT_TRUE(report.backward_skipped.empty()) << report.backward_skipped;
  std::string metrics;
  for (const gqattn::check::Metric& m : report.metrics)
    metrics += " " + m.name + " " + std::to_string(m.error) + "/" + std::to_string(m.tolerance) +
               (m.note.empty() ? "" : " (" + m.note + ")");
  EXPECT_TRUE(report.pass) << c.name << ":" << metrics
                           << (report.deterministic ? "" : " [not bitwise reproducible]");
}

class FlashVarlen : public ::testing::TestWithParam<VarlenFlashCase> {};

TEST_P(FlashVarlen, SeparateDq) { run_case(GetParam(), forced(DqPath::separate)); }

TEST_P(FlashVarlen, OrderedDq) { run_case(GetParam(), forced(DqPath::fused)); }

TEST_P(FlashVarlen, AtomicDq) {
  run_case(GetParam(), forced(DqPath::atomic), /*deterministic=*/false);
}

// The dQ strategy the rule takes, deterministic or not.
TEST_P(FlashVarlen, RuleDq) {
  run_case(GetParam(), PlanOverride{});
  run_case(GetParam(), PlanOverride{}, /*deterministic=*/false);
}

TEST_P(FlashVarlen, SmallTileOrderedDq) {
  run_case(GetParam(), forced(DqPath::fused, DkdvTileChoice::small));
}

TEST_P(FlashVarlen, SmallTileAtomicDq) {
  run_case(GetParam(), forced(DqPath::atomic, DkdvTileChoice::small), /*deterministic=*/false);
}

TEST_P(FlashVarlen, SmallTileSeparateDq) {
  run_case(GetParam(), forced(DqPath::separate, DkdvTileChoice::small));
}

// d256's smaller tile (fused dQ only); d64, d128 take their smallest.
TEST_P(FlashVarlen, SmallerTileOrderedDq) {
  run_case(GetParam(), forced(DqPath::fused, DkdvTileChoice::smaller));
}

INSTANTIATE_TEST_SUITE_P(Batches, FlashVarlen, ::testing::ValuesIn(cases()), case_name);

}  // namespace
