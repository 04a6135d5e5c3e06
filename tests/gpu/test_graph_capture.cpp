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
//
// GraphCaptureKvCache: a KV-cache decoding step (forward_with_kv_cache, a
// paged cache of 16-key pages, Tq = 1, one new key appended) on each fused
// backend, its int32 vectors read on the device (Options::check_offsets =
// false: no host copy to break the capture), captured and replayed: each
// replay gives the eager bits of the inputs the buffers hold then (the
// cache, q, the new key and value, cache_seqlens and block_table all change
// between replays) and leaves the new key and value in the slot after each
// sequence's cached keys, the rest of the cache untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
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

// A captured graph of what `work` launches on `stream`, instantiated; ends
// a capture left open by a throw.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, cudaStreamCaptureMode mode,
                const std::function<void()>& work) {
    gqattn::test::cuda_ok(cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture");
    try {
      work();
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
  const CapturedGraph graph(stream.get(), c.mode, [&] { buffers.run(options); });
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

// ---- a KV-cache decoding step ----------------------------------------------------

struct KvCaptureCase {
  const char* name;
  Backend backend;
  cudaStreamCaptureMode mode;
  bool batch_invariant = false;
};

std::string kv_case_name(const ::testing::TestParamInfo<KvCaptureCase>& info) {
  return info.param.name;
}

constexpr int64_t kKvPage = 16;
constexpr int64_t kKvPagesPerSeq = 125;                   // capacity 2000 keys
constexpr int64_t kKvPoolPages = 3 * kKvPagesPerSeq + 5;  // 5 pages nobody uses

// Three sequences of one query over a paged cache, GQA 8/2, d 128.
Problem kv_decoding_problem() {
  Problem p;
  p.B = 3;
  p.Tq = 1;
  p.Tk = kKvPage * kKvPagesPerSeq;
  p.H = 8;
  p.Hkv = 2;
  p.d = 128;
  p.causal = true;
  p.kv_cache = true;
  p.kv_page_size = kKvPage;
  return p;
}

// One step's inputs: bf16 bits, and the cache's int32 vectors (one new key
// per sequence).
struct KvStep {
  std::vector<uint16_t> k_cache, v_cache, q, k_new, v_new;
  std::vector<int32_t> seqlens, table;
};

KvStep kv_step(const Problem& p, const std::vector<int32_t>& seqlens, uint64_t seed) {
  KvStep s;
  const int64_t cache_n = kKvPoolPages * kKvPage * p.Hkv * p.d;
  s.k_cache = gqattn::test::random_bf16(cache_n, seed);
  s.v_cache = gqattn::test::random_bf16(cache_n, seed + 1);
  s.q = gqattn::test::random_bf16(p.B * p.Tq * p.H * p.d, seed + 2);
  s.k_new = gqattn::test::random_bf16(p.B * p.Hkv * p.d, seed + 3);
  s.v_new = gqattn::test::random_bf16(p.B * p.Hkv * p.d, seed + 4);
  std::vector<int32_t> pages(static_cast<std::size_t>(kKvPoolPages));
  std::iota(pages.begin(), pages.end(), 0);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::shuffle(pages.begin(), pages.end(), rng);
  s.table.assign(pages.begin(), pages.begin() + p.B * kKvPagesPerSeq);
  s.seqlens = seqlens;
  return s;
}

// The cache after the step: sequence b's new key and value in its slot
// seqlens[b], every other element as before.
void appended(const Problem& p, const KvStep& s, std::vector<uint16_t>& k,
              std::vector<uint16_t>& v) {
  k = s.k_cache;
  v = s.v_cache;
  const int64_t row = p.Hkv * p.d;  // one slot
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t pos = s.seqlens[static_cast<std::size_t>(b)];
    const int64_t page = s.table[static_cast<std::size_t>(b * kKvPagesPerSeq + pos / kKvPage)];
    const int64_t at = (page * kKvPage + pos % kKvPage) * row;
    std::copy_n(s.k_new.begin() + b * row, row, k.begin() + at);
    std::copy_n(s.v_new.begin() + b * row, row, v.begin() + at);
  }
}

struct KvOutputs {
  std::vector<uint16_t> o, k_cache, v_cache;
  std::vector<uint32_t> lse;
};

// Packed device tensors of one step.
struct KvBuffers {
  explicit KvBuffers(const Problem& p)
      : problem(p),
        k_cache(bytes16(kKvPoolPages * kKvPage * p.Hkv * p.d)),
        v_cache(bytes16(kKvPoolPages * kKvPage * p.Hkv * p.d)),
        q(bytes16(p.B * p.Tq * p.H * p.d)),
        k_new(bytes16(p.B * p.Hkv * p.d)),
        v_new(bytes16(p.B * p.Hkv * p.d)),
        o(bytes16(p.B * p.Tq * p.H * p.d)),
        lse(static_cast<std::size_t>(p.B * p.H * p.Tq) * sizeof(float)),
        seqlens(static_cast<std::size_t>(p.B) * sizeof(int32_t)),
        table(static_cast<std::size_t>(p.B * kKvPagesPerSeq) * sizeof(int32_t)) {}

  static std::size_t bytes16(int64_t n) { return static_cast<std::size_t>(n) * 2; }

  // New inputs and poisoned outputs, complete before the caller's stream
  // (non-blocking) runs anything.
  void load(const KvStep& s) {
    k_cache.upload(s.k_cache);
    v_cache.upload(s.v_cache);
    q.upload(s.q);
    k_new.upload(s.k_new);
    v_new.upload(s.v_new);
    seqlens.upload(s.seqlens);
    table.upload(s.table);
    o.poison();
    lse.poison();
    gqattn::test::device_synchronize();
  }

  static gqattn::OffsetsRef ints(const gqattn::test::DeviceBuffer& b) {
    gqattn::OffsetsRef r;
    r.data = static_cast<const int32_t*>(b.get());
    r.device = gqattn::Device::cuda;
    r.size = static_cast<int64_t>(b.bytes() / sizeof(int32_t));
    return r;
  }

  void run(const gqattn::Options& options) const {
    const Problem& p = problem;
    const DType t = DType::bf16;
    const gqattn::Device cuda = gqattn::Device::cuda;
    gqattn::KvCache cache;
    cache.k = gqattn::contiguous(k_cache.get(), t, cuda, kKvPoolPages, kKvPage, p.Hkv, p.d);
    cache.v = gqattn::contiguous(v_cache.get(), t, cuda, kKvPoolPages, kKvPage, p.Hkv, p.d);
    cache.seqlens = ints(seqlens);
    cache.block_table = ints(table);
    cache.pages_per_seq = kKvPagesPerSeq;
    gqattn::forward_with_kv_cache(
        p, cache, gqattn::contiguous(q.get(), t, cuda, p.B, p.Tq, p.H, p.d),
        gqattn::contiguous(k_new.get(), t, cuda, p.B, 1, p.Hkv, p.d),
        gqattn::contiguous(v_new.get(), t, cuda, p.B, 1, p.Hkv, p.d),
        gqattn::contiguous(o.get(), t, cuda, p.B, p.Tq, p.H, p.d),
        gqattn::contiguous(lse.get(), DType::f32, cuda, p.B, p.H, p.Tq), options);
  }

  KvOutputs download() const {
    KvOutputs out;
    out.o = o.download<uint16_t>();
    out.lse = lse.download<uint32_t>();
    out.k_cache = k_cache.download<uint16_t>();
    out.v_cache = v_cache.download<uint16_t>();
    return out;
  }

  Problem problem;
  gqattn::test::DeviceBuffer k_cache, v_cache, q, k_new, v_new, o, lse, seqlens, table;
};

// An eager step: every output element written (no poison left), the cache
// as appended() says.
void expect_written_and_appended(const Problem& p, const KvStep& s, const KvOutputs& got,
                                 const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(std::count(got.o.begin(), got.o.end(), gqattn::test::kPoisonBits16), 0)
      << "o elements unwritten";
  EXPECT_EQ(std::count(got.lse.begin(), got.lse.end(), 0xFFFFFFFFu), 0) << "lse elements unwritten";
  std::vector<uint16_t> k, v;
  appended(p, s, k, v);
  EXPECT_TRUE(got.k_cache == k) << "k_cache: the new key not in its slot, or another slot changed";
  EXPECT_TRUE(got.v_cache == v)
      << "v_cache: the new value not in its slot, or another slot changed";
}

void expect_same_kv_bits(const KvOutputs& got, const KvOutputs& want, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(got.o == want.o) << "o differs from the eager run";
  EXPECT_TRUE(got.lse == want.lse) << "lse differs from the eager run";
  EXPECT_TRUE(got.k_cache == want.k_cache) << "k_cache differs from the eager run's";
  EXPECT_TRUE(got.v_cache == want.v_cache) << "v_cache differs from the eager run's";
}

class GraphCaptureKvCache : public ::testing::TestWithParam<KvCaptureCase> {};

TEST_P(GraphCaptureKvCache, ReplaysGiveTheEagerBitsAndAppendTheNewKey) {
  GQATTN_SKIP_WITHOUT_CUDA();
  const KvCaptureCase& c = GetParam();
  const Problem p = kv_decoding_problem();
  const DType dtype = DType::bf16;
  const gqattn::Explanation e = gqattn::explain(p, dtype, gqattn::Device::cuda, c.backend);
  if (!e.supported) GTEST_SKIP() << gqattn::backend_name(c.backend) << ": " << e.reason;
  // Lengths of a page's first, middle and last slot, and the capacity's last.
  const KvStep first = kv_step(p, {1504, 37, 1800}, kSeed);
  const KvStep second = kv_step(p, {1505, 911, 1999}, kSeed + 1);
  KvBuffers buffers(p);
  gqattn::test::Stream stream;
  gqattn::Options options = gqattn::test::options_for(c.backend, stream.get());
  options.check_offsets = false;
  options.batch_invariant = c.batch_invariant;

  buffers.load(first);
  buffers.run(options);
  stream.synchronize();
  const KvOutputs eager_first = buffers.download();
  expect_written_and_appended(p, first, eager_first, "eager, first inputs");
  buffers.load(second);
  buffers.run(options);
  stream.synchronize();
  const KvOutputs eager_second = buffers.download();
  expect_written_and_appended(p, second, eager_second, "eager, second inputs");
  ASSERT_FALSE(eager_first.o == eager_second.o)
      << "the two input sets must give different outputs, or a stale replay would pass";

  buffers.load(first);
  const CapturedGraph graph(stream.get(), c.mode, [&] { buffers.run(options); });
  graph.replay(stream.get());
  expect_same_kv_bits(buffers.download(), eager_first, "first replay, first inputs");
  buffers.load(second);
  graph.replay(stream.get());
  expect_same_kv_bits(buffers.download(), eager_second, "second replay, second inputs");
  gqattn::test::cuda_ok(cudaGetLastError(), "after the replays");
}

INSTANTIATE_TEST_SUITE_P(
    FusedBackends, GraphCaptureKvCache,
    ::testing::Values(
        KvCaptureCase{"flash_global", Backend::CudaFlash, cudaStreamCaptureModeGlobal},
        KvCaptureCase{"flash_relaxed", Backend::CudaFlash, cudaStreamCaptureModeRelaxed},
        KvCaptureCase{"flash_batch_invariant_global", Backend::CudaFlash,
                      cudaStreamCaptureModeGlobal, true},
        KvCaptureCase{"hopper_global", Backend::CudaHopper, cudaStreamCaptureModeGlobal},
        KvCaptureCase{"hopper_relaxed", Backend::CudaHopper, cudaStreamCaptureModeRelaxed},
        KvCaptureCase{"hopper_batch_invariant_global", Backend::CudaHopper,
                      cudaStreamCaptureModeGlobal, true}),
    kv_case_name);

}  // namespace

#endif  // GQATTN_WITH_CUDA
