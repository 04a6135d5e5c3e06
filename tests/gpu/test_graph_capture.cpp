// The CUDA backends under CUDA graph capture, as torch.cuda.graphs and
// torch.compile(mode="reduce-overhead") use them: a forward then a backward
// on the caller's stream, captured once and replayed. Each replay must give
// the bits of eager calls on the inputs the buffers hold at replay time (a
// second set of inputs is uploaded between replays, so a graph that baked in
// the first inputs or reused stale workspace fails), with every output
// written (outputs NaN-poisoned before each run). Captured in the global
// mode (any call that is unsafe while a stream captures fails the capture)
// and in the relaxed mode. Per CUDA backend and, for cuda-hopper, per dQ
// path (forced through the plan override): the fused path launches its
// conversion kernel by programmatic dependent launch, the separate path a
// third kernel; and cuda-hopper's split-KV decoding forward (three splits,
// forced), whose combine kernel is a programmatic dependent launch too
// (a programmatic dependent launch). Skips, saying why,
// where a backend cannot run the problem.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/plan_override.hpp"
#include "attention_harness.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"

#ifdef GQATTN_WITH_CUDA

namespace {

using gqattn::Backend;
using gqattn::DType;
using gqattn::Problem;
using gqattn::test::DeviceTensor;
using gqattn::test::Inputs;

constexpr uint64_t kSeed = 20261203;

struct CaptureCase {
  const char* name;
  Backend backend;
  // The plan forced (parse_plan_override's text; "": the rules').
  const char* force;
  cudaStreamCaptureMode mode;
  // A decoding step (decoding_problem) in place of capture_problem: on
  // cuda-hopper its forward packs the query heads and, with splits=3
  // forced, splits the keys, so a second kernel (the combine) and its
  // partials' workspace are captured too.
  bool decoding = false;
};

std::string case_name(const ::testing::TestParamInfo<CaptureCase>& info) { return info.param.name; }

// Long enough for several key tiles and query tiles on every backend (and,
// for cuda-hopper's fused dQ, ordered adds from several key tiles into one
// accumulator block), GQA, causal, T not a multiple of the tiles.
Problem capture_problem() {
  Problem p;
  p.B = 2;
  p.Tq = p.Tk = 333;
  p.H = 4;
  p.Hkv = 2;
  p.d = 128;
  p.causal = true;
  return p;
}

// One query row per head against a long context.
Problem decoding_problem() {
  Problem p;
  p.B = 2;
  p.Tq = 1;
  p.Tk = 2000;
  p.H = 8;
  p.Hkv = 2;
  p.d = 128;
  p.causal = true;
  return p;
}

// The outputs of one forward and backward, packed, as floats.
struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
  bool padding_intact = true;
};

DeviceTensor packed_tensor(DType dtype, int rank, const gqattn::test::Shape4& shape) {
  return gqattn::test::device_tensor(dtype, gqattn::test::Layout::packed, rank, shape);
}

// Packed device tensors of one problem: inputs, forward outputs (also the
// backward's inputs) and gradients.
struct Buffers {
  Buffers(const Problem& p, DType dtype)
      : problem(p),
        q(packed_tensor(dtype, 4, gqattn::test::q_shape(p))),
        k(packed_tensor(dtype, 4, gqattn::test::kv_shape(p))),
        v(packed_tensor(dtype, 4, gqattn::test::kv_shape(p))),
        dout(packed_tensor(dtype, 4, gqattn::test::q_shape(p))),
        o(packed_tensor(dtype, 4, gqattn::test::q_shape(p))),
        lse(packed_tensor(DType::f32, 3, gqattn::test::lse_shape(p))),
        dq(packed_tensor(dtype, 4, gqattn::test::q_shape(p))),
        dk(packed_tensor(dtype, 4, gqattn::test::kv_shape(p))),
        dv(packed_tensor(dtype, 4, gqattn::test::kv_shape(p))) {}

  // New inputs and poisoned outputs, complete before the caller's stream
  // (non-blocking: it does not wait for the legacy stream) runs anything.
  void load(const Inputs& in) {
    gqattn::test::upload_values(q, in.q);
    gqattn::test::upload_values(k, in.k);
    gqattn::test::upload_values(v, in.v);
    gqattn::test::upload_values(dout, in.dout);
    for (DeviceTensor* t : {&o, &lse, &dq, &dk, &dv}) t->buffer.poison();
    gqattn::test::device_synchronize();
  }

  void run(const gqattn::Options& options) const {
    gqattn::forward(problem, q.ref, k.ref, v.ref, o.ref, lse.ref, options);
    gqattn::backward(problem, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, dq.ref, dk.ref, dv.ref,
                     options);
  }

  Outputs download() const {
    Outputs out;
    out.o = gqattn::test::download_values(o, out.padding_intact);
    out.lse = gqattn::test::download_values(lse, out.padding_intact);
    out.dq = gqattn::test::download_values(dq, out.padding_intact);
    out.dk = gqattn::test::download_values(dk, out.padding_intact);
    out.dv = gqattn::test::download_values(dv, out.padding_intact);
    return out;
  }

  Problem problem;
  DeviceTensor q, k, v, dout, o, lse, dq, dk, dv;
};

void expect_same_bits(const Outputs& got, const Outputs& want, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(got.padding_intact);
  const std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>>
      pairs[] = {{"o", {&got.o, &want.o}},
                 {"lse", {&got.lse, &want.lse}},
                 {"dq", {&got.dq, &want.dq}},
                 {"dk", {&got.dk, &want.dk}},
                 {"dv", {&got.dv, &want.dv}}};
  for (const auto& [name, tensors] : pairs) {
    const gqattn::test::Comparison c = gqattn::test::compare(*tensors.first, *tensors.second);
    EXPECT_TRUE(c.bitwise) << name << " differs from the eager run (max rel error " << c.error
                           << ") " << c.note;
  }
}

// A captured graph, instantiated; ends a capture left open by a throw.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, cudaStreamCaptureMode mode, const Buffers& buffers,
                const gqattn::Options& options) {
    gqattn::test::cuda_ok(cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture");
    try {
      buffers.run(options);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) (void)cudaGraphDestroy(broken);
      (void)cudaGetLastError();
      throw;
    }
    gqattn::test::cuda_ok(cudaStreamEndCapture(stream, &graph_), "cudaStreamEndCapture");
    gqattn::test::cuda_ok(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  ~CapturedGraph() {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  void replay(cudaStream_t stream) const {
    gqattn::test::cuda_ok(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
    gqattn::test::cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize(replay)");
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

class GraphCapture : public ::testing::TestWithParam<CaptureCase> {};

TEST_P(GraphCapture, ReplaysGiveTheEagerBitsOfTheCurrentInputs) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const CaptureCase& c = GetParam();
  const Problem p = c.decoding ? decoding_problem() : capture_problem();
  const DType dtype = DType::bf16;
  for (gqattn::Pass pass : {gqattn::Pass::forward, gqattn::Pass::backward}) {
    const gqattn::Explanation e = gqattn::explain(p, dtype, gqattn::Device::cuda, c.backend, pass);
    if (!e.supported) GTEST_SKIP() << gqattn::backend_name(c.backend) << ": " << e.reason;
  }
  const gqattn::detail::ScopedPlanOverride scope(gqattn::detail::parse_plan_override(c.force));
  const Inputs first = gqattn::test::random_inputs(p, dtype, kSeed);
  const Inputs second = gqattn::test::random_inputs(p, dtype, kSeed + 1);
  Buffers buffers(p, dtype);
  gqattn::test::Stream stream;
  const gqattn::Options options = gqattn::test::options_for(c.backend, stream.get());

  buffers.load(first);
  buffers.run(options);
  stream.synchronize();
  const Outputs eager_first = buffers.download();
  buffers.load(second);
  buffers.run(options);
  stream.synchronize();
  const Outputs eager_second = buffers.download();
  ASSERT_FALSE(gqattn::test::compare(eager_first.dq, eager_second.dq).bitwise)
      << "the two input sets must give different gradients, or a stale replay would pass";

  buffers.load(first);
  const CapturedGraph graph(stream.get(), c.mode, buffers, options);
  graph.replay(stream.get());
  expect_same_bits(buffers.download(), eager_first, "first replay, first inputs");
  buffers.load(second);
  graph.replay(stream.get());
  expect_same_bits(buffers.download(), eager_second, "second replay, second inputs");
}

INSTANTIATE_TEST_SUITE_P(
    Backends, GraphCapture,
    ::testing::Values(
        CaptureCase{"hopper_fused_dq_global", Backend::CudaHopper, "dq=fused",
                    cudaStreamCaptureModeGlobal},
        CaptureCase{"hopper_separate_dq_global", Backend::CudaHopper, "dq=separate",
                    cudaStreamCaptureModeGlobal},
        CaptureCase{"hopper_fused_dq_relaxed", Backend::CudaHopper, "dq=fused",
                    cudaStreamCaptureModeRelaxed},
        CaptureCase{"hopper_decoding_split_kv_global", Backend::CudaHopper, "splits=3",
                    cudaStreamCaptureModeGlobal, true},
        CaptureCase{"flash_global", Backend::CudaFlash, "", cudaStreamCaptureModeGlobal},
        CaptureCase{"flash_relaxed", Backend::CudaFlash, "", cudaStreamCaptureModeRelaxed},
        CaptureCase{"unfused_global", Backend::CudaUnfused, "", cudaStreamCaptureModeGlobal},
        CaptureCase{"unfused_relaxed", Backend::CudaUnfused, "", cudaStreamCaptureModeRelaxed}),
    case_name);

}  // namespace

#endif  // GQATTN_WITH_CUDA
