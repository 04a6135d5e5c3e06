// The fused backends on head dims between their kernels' (64, 128, 256):
// d = 8..256, a multiple of 8, runs on the next kernel up with zero-filled
// loads and stores that stop at d (fused/problem_args.hpp kernel_head_dim):
// cuda-hopper, and cuda-flash on its padded kernel instances (kPadded,
// docs/decisions/flash-padded-head-dims.md). Checked two ways per case:
// - against the f64 oracle through gqattn::check (NaN-poisoned outputs,
//   forward and backward, bitwise reruns), down every path the plans can
//   take for it: default, packed GQA with split-KV (decode-like), softcap
//   and window, every dQ path forced (cuda-flash: separate, ordered and
//   atomic, on each of its dK/dV tiles), a varlen batch (cuda-flash's on
//   every dQ path, and once with NaN-poisoned gaps after every row);
// - with 8 poisoned columns after every row of every tensor (row stride
//   d + 8): a load past d would read poison into the sums (the results must
//   equal the packed run's bit for bit; the atomic dQ's within rounding) and
//   a store past d would overwrite it (the gap must stay intact). On
//   cuda-flash down every dQ path and dK/dV tile: its padded instances are
//   also the ones varlen batches run, so this checks their stores too.
// Skips, saying why, where a backend cannot run (cuda-hopper: no sm_90 GPU;
// no GPU at all).
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

constexpr Backend kBackends[] = {Backend::CudaHopper, Backend::CudaFlash};

// A plan forced through the plan override, and Options::deterministic of
// the calls (false for cuda-flash's atomic dQ: then no bitwise reruns).
struct Path {
  const char* force;
  bool deterministic = true;
};

// cuda-flash's dQ paths on each of its dK/dV tiles (a tile d lacks is
// clamped to d's smallest; d256's smaller tile has only the fused dQ
// paths, so the separate one is not asked of it).
const Path kFlashPaths[] = {
    {"dq=separate"},
    {"dq=fused"},
    {"dq=atomic", false},
    {"dkdv_tile=small,dq=separate"},
    {"dkdv_tile=small,dq=fused"},
    {"dkdv_tile=small,dq=atomic", false},
    {"dkdv_tile=smaller,dq=fused"},
    {"dkdv_tile=smaller,dq=atomic", false},
};

struct Batch {
  bool varlen = false;
  bool padded_strides = false;  // NaN-poisoned gaps after every row (gqattn::check)
};

void expect_matches_oracle(const PaddedCase& c, Backend backend, const Path& path,
                           Batch batch = {}) {
  const gqattn::detail::ScopedPlanOverride scope(gqattn::detail::parse_plan_override(path.force));
  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = backend;
  config.seed = kSeed;
  config.deterministic = path.deterministic;
  config.determinism = path.deterministic;
  config.padded_strides = batch.padded_strides;
  if (batch.varlen) {
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
  const std::string label = c.name + " " + gqattn::backend_name(backend) + " [" + path.force + "]" +
                            (batch.varlen ? " varlen" : "") + (batch.padded_strides ? " gaps" : "");
  if (!why.supported) {
    std::printf("  skipped %s: %s\n", label.c_str(), why.reason.c_str());
    return;
  }
  const gqattn::check::Report report = gqattn::check::run(config);
  ASSERT_TRUE(report.ran) << label << ": " << report.skipped;
  EXPECT_TRUE(report.backward_skipped.empty()) << label << ": " << report.backward_skipped;
  EXPECT_TRUE(report.pass) << label << ":" << metrics_of(report);
  EXPECT_TRUE(report.deterministic) << label;
}

class PaddedHeadDim : public ::testing::TestWithParam<PaddedCase> {};

TEST_P(PaddedHeadDim, MatchesTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends) expect_matches_oracle(GetParam(), backend, {""});
}
TEST_P(PaddedHeadDim, SeparateDqMatchesTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends)
    expect_matches_oracle(GetParam(), backend, {"dq=separate"});
}
TEST_P(PaddedHeadDim, VarlenMatchesTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends)
    expect_matches_oracle(GetParam(), backend, {""}, {/*varlen=*/true});
}
// cuda-flash: every dQ path on every dK/dV tile, dense and varlen; a varlen
// batch with poisoned gaps after its rows (a load past d reads NaN).
TEST_P(PaddedHeadDim, FlashDqPathsMatchTheOracle) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Path& path : kFlashPaths) {
    expect_matches_oracle(GetParam(), Backend::CudaFlash, path);
    expect_matches_oracle(GetParam(), Backend::CudaFlash, path, {/*varlen=*/true});
  }
  expect_matches_oracle(GetParam(), Backend::CudaFlash, {""}, {/*varlen=*/true, true});
}

#ifdef GQATTN_WITH_CUDA  // the device tensors of attention_harness.hpp

// A [B, T, heads, d] device tensor whose rows are d + gap apart, the gap
// poisoned (harness: download_values checks it untouched); packed for 0.
t::DeviceTensor gapped(DType dtype, const t::Shape4& shape, int64_t gap) {
  t::DeviceTensor x;
  const int64_t row = shape[3] + gap;
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

constexpr int kTensors = 8;
const char* const kNames[kTensors] = {"o", "dq", "dk", "dv", "q", "k", "v", "do"};

// What a forward and a backward left in every tensor, and whether each
// tensor's gaps are intact.
struct Run {
  std::vector<float> values[kTensors];
  bool gaps_intact[kTensors] = {true, true, true, true, true, true, true, true};
};

// Forward then backward of `in` on tensors whose rows are `gap` columns
// apart past d (0: packed), with the override in force.
Run run_with_gap(const t::Inputs& in, Backend backend, bool deterministic, int64_t gap) {
  const Problem& p = in.problem;
  t::DeviceTensor q = gapped(in.dtype, t::q_shape(p), gap),
                  k = gapped(in.dtype, t::kv_shape(p), gap),
                  v = gapped(in.dtype, t::kv_shape(p), gap),
                  o = gapped(in.dtype, t::q_shape(p), gap),
                  dout = gapped(in.dtype, t::q_shape(p), gap),
                  dq = gapped(in.dtype, t::q_shape(p), gap),
                  dk = gapped(in.dtype, t::kv_shape(p), gap),
                  dv = gapped(in.dtype, t::kv_shape(p), gap);
  t::DeviceTensor lse = t::device_tensor(DType::f32, t::Layout::packed, 3, t::lse_shape(p));
  t::upload_values(q, in.q);
  t::upload_values(k, in.k);
  t::upload_values(v, in.v);
  t::upload_values(dout, in.dout);
  t::device_synchronize();
  gqattn::Options options = t::options_for(backend);
  options.deterministic = deterministic;
  gqattn::forward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, options);
  gqattn::backward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, dq.ref, dk.ref, dv.ref,
                   options);
  t::device_synchronize();
  Run run;
  const t::DeviceTensor* tensors[kTensors] = {&o, &dq, &dk, &dv, &q, &k, &v, &dout};
  for (int i = 0; i < kTensors; ++i)
    run.values[i] = t::download_values(*tensors[i], run.gaps_intact[i]);
  return run;
}

void expect_stays_within_d(const PaddedCase& c, Backend backend, const Path& path) {
  const gqattn::detail::ScopedPlanOverride scope(gqattn::detail::parse_plan_override(path.force));
  const Problem& p = c.problem;
  const gqattn::Explanation why =
      gqattn::explain(p, c.dtype, Device::cuda, backend, gqattn::Pass::backward);
  const std::string label = c.name + " " + gqattn::backend_name(backend) + " [" + path.force + "]";
  if (!why.supported) {
    std::printf("  skipped %s: %s\n", label.c_str(), why.reason.c_str());
    return;
  }
  const t::Inputs in = t::random_inputs(p, c.dtype, kSeed);
  // The packed run: the bits the gapped one must give.
  const Run packed = run_with_gap(in, backend, path.deterministic, 0);
  const Run gapped_run = run_with_gap(in, backend, path.deterministic, kGapColumns);
  const std::vector<float>* inputs[] = {&in.q, &in.k, &in.v, &in.dout};
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_TRUE(gapped_run.gaps_intact[i])
        << label << ": " << kNames[i] << " written past column d";
    // Inputs: unchanged; outputs: the packed run's bits (the atomic dQ's
    // adds come in any order: within rounding of it).
    const std::vector<float>& want = i >= 4 ? *inputs[i - 4] : packed.values[i];
    const t::Comparison same = t::compare(gapped_run.values[i], want);
    if (i == 1 && !path.deterministic)
      EXPECT_LE(same.error, 1e-2) << label << ": dq differs from the packed run " << same.note;
    else
      EXPECT_TRUE(same.bitwise) << label << ": " << kNames[i] << " differs from the packed run "
                                << same.note;
  }
}

TEST_P(PaddedHeadDim, NeverTouchesColumnsPastD) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (const Backend backend : kBackends) expect_stays_within_d(GetParam(), backend, {""});
  for (const Path& path : kFlashPaths) expect_stays_within_d(GetParam(), Backend::CudaFlash, path);
}

#endif  // GQATTN_WITH_CUDA

INSTANTIATE_TEST_SUITE_P(Cases, PaddedHeadDim, ::testing::ValuesIn(cases()), case_name);

}  // namespace
