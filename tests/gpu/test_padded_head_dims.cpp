// cuda-hopper on head dims between its kernels' (64, 128, 256): d = 8..256,
// a multiple of 8, runs on the next kernel up with zero-filled loads and
// stores that stop at d (fused/problem_args.hpp kernel_head_dim). Checked
// two ways per case:
// - against the f64 oracle through gqattn::check (NaN-poisoned outputs,
//   forward and backward, bitwise reruns), down every path the plan can
//   take for it: default, packed GQA with split-KV (decode-like), softcap
//   and window, both dQ paths forced, a varlen batch;
// - with 8 poisoned columns after every row of every tensor (row stride
//   d + 8): a load past d would read poison into the sums (the results must
//   equal the packed run's bit for bit) and a store past d would overwrite
//   it (the gap must stay intact).
// Skips, saying why, where cuda-hopper cannot run (no sm_90 GPU); cuda-flash
// refuses these head dims (test_flash_support.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "api/plan_override.hpp"
#include "attention_harness.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;
namespace t = gqattn::test;

constexpr uint64_t kSeed = 20261206;
constexpr int64_t kGapColumns = 8;  // poisoned columns after each row's d

struct PaddedCase {
  std::string name;
  Problem problem;
  DType dtype = DType::bf16;
};

std::vector<PaddedCase> cases() {
  using gqattn::make_problem;
  return {
      {"d96_causal_T300_gqa4", make_problem(2, 300, 300, 8, 2, 96, true)},
      {"d80_noncausal_Tq77_Tk200_f16", make_problem(1, 77, 200, 4, 4, 80, false), DType::f16},
      {"d192_window64_softcap30_T250", make_problem(1, 250, 250, 4, 2, 192, true, 64, 30.0f)},
      {"d160_causal_T129", make_problem(1, 129, 129, 4, 2, 160, true)},
      {"d40_causal_T100_gqa2", make_problem(2, 100, 100, 6, 3, 40, true)},
      {"d8_noncausal_T33", make_problem(1, 33, 33, 2, 1, 8, false)},
      {"d136_causal_Tq9_Tk700", make_problem(1, 9, 700, 8, 2, 136, true)},
      // Decode-like: packed GQA and split-KV on the d=128 kernel.
      {"d96_decode_Tq1_Tk3000", make_problem(2, 1, 3000, 32, 8, 96, true)},
  };
}

std::string case_name(const ::testing::TestParamInfo<PaddedCase>& info) { return info.param.name; }

std::string metrics_of(const gqattn::check::Report& report) {
  std::string out;
  for (const gqattn::check::Metric& m : report.metrics)
    out += " " + m.name + " " + std::to_string(m.error) + "/" + std::to_string(m.tolerance) +
           (m.note.empty() ? "" : " (" + m.note + ")");
  return out;
}

constexpr Backend kBackends[] = {Backend::CudaHopper};

void expect_matches_oracle(const PaddedCase& c, Backend backend, const char* force,
                           bool varlen = false) {
  const gqattn::detail::ScopedPlanOverride scope(gqattn::detail::parse_plan_override(force));
  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = backend;
  config.seed = kSeed;
  if (varlen) {
    // The case's shape as a varlen batch of four sequences, one empty.
    config.problem.varlen = true;
    config.varlen.seqlens_q = {int32_t(c.problem.Tq), 0, 1, int32_t(c.problem.Tq / 2 + 3)};
    config.varlen.seqlens_k = {int32_t(c.problem.Tk), 5, 1, int32_t(c.problem.Tk / 2 + 1)};
    config.problem.Tq = c.problem.Tq / 2 + 3 > c.problem.Tq ? c.problem.Tq / 2 + 3 : c.problem.Tq;
    config.problem.Tk = c.problem.Tk;
    config.problem.B = 4;
  }
  const gqattn::Explanation why =
      gqattn::explain(config.problem, c.dtype, Device::cuda, backend, gqattn::Pass::backward);
  const std::string label = c.name + " " + gqattn::backend_name(backend) + " [" + force + "]";
  if (!why.supported) {
    std::printf("  skipped %s: %s\n", label.c_str(), why.reason.c_str());
    return;
  }
  const gqattn::check::Report report = gqattn::check::run(config);
  ASSERT_TRUE(report.ran) << label << ": " << report.skipped;
  EXPECT_TRUE(report.pass) << label << ":" << metrics_of(report);
  EXPECT_TRUE(report.deterministic) << label;
}

class PaddedHeadDim : public ::testing::TestWithParam<PaddedCase> {};

TEST_P(PaddedHeadDim, MatchesTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends) expect_matches_oracle(GetParam(), backend, "");
}
TEST_P(PaddedHeadDim, SeparateDqMatchesTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends) expect_matches_oracle(GetParam(), backend, "dq=separate");
}
TEST_P(PaddedHeadDim, VarlenMatchesTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends) expect_matches_oracle(GetParam(), backend, "", true);
}

#ifdef GQATTN_WITH_CUDA  // the device tensors of attention_harness.hpp

// A [B, T, heads, d] device tensor whose rows are d + kGapColumns apart,
// the gap poisoned (harness: download_values checks it untouched).
t::DeviceTensor gapped(DType dtype, const t::Shape4& shape) {
  t::DeviceTensor x;
  const int64_t row = shape[3] + kGapColumns;
  const t::Shape4 stride = {shape[1] * shape[2] * row, shape[2] * row, row, 1};
  x.span = 1;
  for (int r = 0; r < 4; ++r) x.span += (shape[r] - 1) * stride[r];
  x.buffer = gqattn::test::DeviceBuffer(std::size_t(x.span) * gqattn::dtype_size(dtype));
  x.buffer.poison();
  x.ref.data = x.buffer.get();
  x.ref.dtype = dtype;
  x.ref.device = Device::cuda;
  x.ref.rank = 4;
  for (int r = 0; r < 4; ++r) {
    x.ref.shape[r] = shape[r];
    x.ref.stride[r] = stride[r];
  }
  return x;
}

void expect_stays_within_d(const PaddedCase& c, Backend backend) {
  const Problem& p = c.problem;
  const gqattn::Explanation why =
      gqattn::explain(p, c.dtype, Device::cuda, backend, gqattn::Pass::backward);
  const std::string label = c.name + " " + gqattn::backend_name(backend);
  if (!why.supported) {
    std::printf("  skipped %s: %s\n", label.c_str(), why.reason.c_str());
    return;
  }
  const t::Inputs in = t::random_inputs(p, c.dtype, kSeed);
  // The packed run: the bits the gapped one must give.
  const t::ForwardResult fwd = t::gpu_forward(backend, in);
  const t::BackwardResult bwd = t::gpu_backward(backend, in, fwd);

  t::DeviceTensor q = gapped(c.dtype, t::q_shape(p)), k = gapped(c.dtype, t::kv_shape(p)),
                  v = gapped(c.dtype, t::kv_shape(p)), o = gapped(c.dtype, t::q_shape(p)),
                  dout = gapped(c.dtype, t::q_shape(p)), dq = gapped(c.dtype, t::q_shape(p)),
                  dk = gapped(c.dtype, t::kv_shape(p)), dv = gapped(c.dtype, t::kv_shape(p));
  t::DeviceTensor lse = t::device_tensor(DType::f32, t::Layout::packed, 3, t::lse_shape(p));
  t::upload_values(q, in.q);
  t::upload_values(k, in.k);
  t::upload_values(v, in.v);
  t::upload_values(dout, in.dout);
  t::device_synchronize();
  gqattn::forward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, t::options_for(backend));
  gqattn::backward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, dq.ref, dk.ref, dv.ref,
                   t::options_for(backend));
  t::device_synchronize();
  const char* names[] = {"o", "dq", "dk", "dv", "q", "k", "v", "do"};
  const t::DeviceTensor* tensors[] = {&o, &dq, &dk, &dv, &q, &k, &v, &dout};
  const std::vector<float>* packed[] = {&fwd.o, &bwd.dq, &bwd.dk, &bwd.dv,
                                        &in.q,  &in.k,   &in.v,   &in.dout};
  for (int i = 0; i < 8; ++i) {
    bool gap_intact = true;
    const std::vector<float> got = t::download_values(*tensors[i], gap_intact);
    EXPECT_TRUE(gap_intact) << label << ": " << names[i] << " written past column d";
    const t::Comparison same = t::compare(got, *packed[i]);
    EXPECT_TRUE(same.bitwise) << label << ": " << names[i] << " differs from the packed run "
                              << same.note;
  }
}

TEST_P(PaddedHeadDim, NeverTouchesColumnsPastD) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends) expect_stays_within_d(GetParam(), backend);
}

#endif  // GQATTN_WITH_CUDA

INSTANTIATE_TEST_SUITE_P(Cases, PaddedHeadDim, ::testing::ValuesIn(cases()), case_name);

}  // namespace
