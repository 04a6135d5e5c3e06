// cuda-hopper's forward on varlen batches (Problem::varlen) against the f64
// oracle per sequence, through gqattn::check (packed tensors, NaN-poisoned
// outputs), on what is cuda-hopper's own (docs/decisions/
// hopper-varlen-forward.md): the persistent schedule's empty tiles (a long
// sequence beside empty and one-row ones), the end-aligned causal tiles
// per sequence (Tq_b > Tk_b, lengths not multiples of any tile), packed
// GQA (decode-like batches), split-KV forced through the plan override,
// seqused_k, and an explicit q_start below 0 and past Tk. The
// backend-independent varlen cases are tests/gpu/test_varlen.cpp's. Every
// case skips, saying why, where cuda-hopper cannot run it.
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

constexpr uint64_t kSeed = 20261205;

struct VarlenHopperCase {
  std::string name;
  Problem problem;  // varlen; Tq, Tk the longest lengths
  std::vector<int32_t> seqlens_q, seqlens_k, seqused_k;
  DType dtype = DType::bf16;
  bool packed = false;  // the rule packs GQA heads (max_seqlen_q < block_m)
};

std::ostream& operator<<(std::ostream& os, const VarlenHopperCase& c) { return os << c.name; }

std::string case_name(const ::testing::TestParamInfo<VarlenHopperCase>& info) {
  return info.param.name;
}

int32_t longest(const std::vector<int32_t>& x) {
  int32_t m = 1;
  for (int32_t v : x) m = v > m ? v : m;
  return m;
}

VarlenHopperCase make(std::string name, int64_t H, int64_t Hkv, int64_t d, bool causal,
                      int64_t window, std::vector<int32_t> q, std::vector<int32_t> k,
                      std::vector<int32_t> used = {}, DType dtype = DType::bf16,
                      float softcap = 0.0f) {
  VarlenHopperCase c;
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

std::vector<VarlenHopperCase> cases() {
  std::vector<VarlenHopperCase> out;
  for (int64_t d : {64, 128, 256}) {
    const std::string dn = "_d" + std::to_string(d);
    // A long sequence (many query and key tiles) beside empty and one-row
    // ones: most of the grid's tiles are empty.
    out.push_back(make("long_beside_empty_causal_gqa4" + dn, 8, 2, d, true, 0,
                       {0, 1000, 0, 1, 0, 130, 1}, {5, 900, 0, 1, 0, 260, 40}));
    // Causal with Tq_b > Tk_b (rows without keys at each start) and
    // lengths off every tile: end-aligned tiles per sequence.
    out.push_back(make("causal_tq_above_tk" + dn, 4, 4, d, true, 0, {300, 50, 129, 65},
                       {100, 10, 129, 200}, {}, DType::f16));
    // No mask, seqused_k below the packed keys (whole key tiles unused).
    out.push_back(make("seqused_k_no_mask_mqa" + dn, 4, 1, d, false, 0, {200, 0, 50, 1},
                       {400, 10, 80, 3}, {150, 7, 0, 3}));
    // Sliding window with softcap.
    out.push_back(make("window100_softcap" + dn, 4, 2, d, true, 100, {333, 17, 256}, {400, 17, 300},
                       {}, DType::bf16, 30.0f));
    // Decode-like: max_seqlen_q below the tile, eight query heads a kv
    // head: the rule packs GQA.
    VarlenHopperCase decode = make("decode_packed_gqa8" + dn, 16, 2, d, false, 0, {1, 3, 0, 2, 1},
                                   {500, 2000, 10, 0, 130});
    decode.packed = true;
    out.push_back(decode);
    VarlenHopperCase decode_causal = make("decode_packed_causal" + dn, 8, 1, d, true, 0,
                                          {5, 1, 7, 0}, {700, 3, 2, 9}, {}, DType::f16);
    decode_causal.packed = true;
    out.push_back(decode_causal);
    // q_start below 0: the first rows of every sequence keep no key.
    VarlenHopperCase neg =
        make("q_start_negative_causal" + dn, 4, 2, d, true, 0, {150, 3, 0, 300}, {100, 3, 4, 320});
    neg.problem.q_start = -20;
    out.push_back(neg);
    // q_start past Tk: causal keeps every key; with a window no row keeps
    // any of the short sequences' keys.
    VarlenHopperCase past =
        make("q_start_past_tk_causal" + dn, 4, 4, d, true, 0, {130, 64, 1}, {90, 300, 5});
    past.problem.q_start = 1000;
    out.push_back(past);
    VarlenHopperCase past_window =
        make("q_start_past_tk_window" + dn, 4, 4, d, true, 50, {130, 64, 1}, {90, 1100, 5});
    past_window.problem.q_start = 1000;
    out.push_back(past_window);
  }
  return out;
}

// Runs case `c` forward with the plan `force` forced, against the f64
// oracle per sequence. Skips, saying why, where cuda-hopper refuses it.
void run_case(const VarlenHopperCase& c, const char* force) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const gqattn::detail::ScopedPlanOverride scope(gqattn::detail::parse_plan_override(force));
  const gqattn::Explanation why =
      gqattn::explain(c.problem, c.dtype, Device::cuda, Backend::CudaHopper);
  if (!why.supported) {
    GTEST_SKIP() << why.reason;
  }
  EXPECT_NE(why.plan.find("varlen"), std::string::npos) << why.plan;
  if (c.packed) {
    EXPECT_NE(why.plan.find("packed GQA"), std::string::npos) << why.plan;
  }

  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = Backend::CudaHopper;
  config.seed = kSeed;
  config.backward = false;
  config.varlen.seqlens_q = c.seqlens_q;
  config.varlen.seqlens_k = c.seqlens_k;
  config.varlen.seqused_k = c.seqused_k;
  const gqattn::check::Report report = gqattn::check::run(config);
  EXPECT_TRUE(report.ran) << report.skipped;
  EXPECT_EQ(report.backend, Backend::CudaHopper);
  std::string metrics;
  for (const gqattn::check::Metric& m : report.metrics)
    metrics += " " + m.name + " " + std::to_string(m.error) + "/" + std::to_string(m.tolerance) +
               (m.note.empty() ? "" : " (" + m.note + ")");
  EXPECT_TRUE(report.pass) << c.name << " [" << force << "]:" << metrics;
}

class HopperVarlenForward : public ::testing::TestWithParam<VarlenHopperCase> {};

TEST_P(HopperVarlenForward, Rule) { run_case(GetParam(), ""); }

// Split-KV with varlen: every sequence's key tiles in three ranges (some
// empty), merged by the varlen combine kernel.
TEST_P(HopperVarlenForward, ThreeSplits) { run_case(GetParam(), "splits=3"); }

INSTANTIATE_TEST_SUITE_P(Batches, HopperVarlenForward, ::testing::ValuesIn(cases()), case_name);

}  // namespace
