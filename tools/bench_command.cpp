// `gqattn bench`: times each backend that runs one problem on one device
// (CPU wall clock; on CUDA, events behind a GPU spin) and prints ms, FLOP/s
// and the ratio to the fastest. Its flags and help text are in
// command_line.cpp. Checked by tests/cpu/test_cli_bench.cpp.
#include "bench_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli_args.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"

#ifdef GQATTN_WITH_CUDA
#include "bench_cuda.hpp"  // events, a private stream and the spin: CUDA builds only
#endif

namespace gqattn_cli {
namespace {

constexpr double kFlopsPerPairPerDim = 4.0;  // QK^T and PV: 2 FLOPs per multiply-add each
constexpr double kBackwardFlopFactor = 2.5;  // as gqattn_bench and docs/performance.md count
constexpr float kBenchInputMean = 0.5f;
// CUDA: the spin queued ahead of each timed call (a gqattn call takes the
// host 0.01-0.07 ms to queue, docs/performance.md; calls the host queued
// slower than this are counted and reported), and the input sets rotated
// between calls: together more than 4x the L2 cache of an H100/H200.
constexpr int kSpinAheadUs = 500;
constexpr std::size_t kRotateBytes = std::size_t(256) << 20;
constexpr int kMaxSets = 16;

// (query, key) pairs the mask keeps in one head, over the whole batch:
// B x Problem::kept_pairs(), or for a varlen batch the sum over its
// sequences, each the dense problem of its own lengths (docs/semantics.md).
double batch_kept_pairs(const gqattn::Problem& p, const gqattn::oracle::VarlenLayout& layout) {
  if (!p.varlen) return double(p.B) * double(p.kept_pairs());
  double pairs = 0.0;
  for (std::size_t b = 0; b + 1 < layout.cu_seqlens_q.size(); ++b) {
    gqattn::Problem one = p;
    one.varlen = false;
    one.B = 1;
    one.Tq = layout.cu_seqlens_q[b + 1] - layout.cu_seqlens_q[b];
    one.Tk = layout.seqused_k.empty() ? layout.cu_seqlens_k[b + 1] - layout.cu_seqlens_k[b]
                                      : layout.seqused_k[b];
    pairs += double(one.kept_pairs());
  }
  return pairs;
}

double median(std::vector<double> x) {
  if (x.empty()) return 0.0;
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// Memory on the bench's device, all freed together.
class Arena {
 public:
  explicit Arena(bool cuda) : cuda_(cuda) {
#ifndef GQATTN_WITH_CUDA
    if (cuda_) throw std::runtime_error("this build of the tool has no CUDA");
#endif
  }
  ~Arena() {
#ifdef GQATTN_WITH_CUDA
    for (void* data : device_) gqattn_tool::cuda_free(data);
#endif
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 1);  // an empty varlen batch still gets an address
#ifdef GQATTN_WITH_CUDA
    if (cuda_) {
      device_.push_back(gqattn_tool::cuda_alloc(bytes));
      return device_.back();
    }
#endif
    host_.emplace_back(new unsigned char[bytes]());
    return host_.back().get();
  }
  void* copy_of(const void* host, std::size_t bytes) {
    void* data = alloc(bytes);
#ifdef GQATTN_WITH_CUDA
    if (cuda_) {
      if (bytes > 0) gqattn_tool::cuda_upload(data, host, bytes);
      return data;
    }
#endif
    if (bytes > 0) std::memcpy(data, host, bytes);
    return data;
  }

 private:
  bool cuda_;
  std::vector<std::unique_ptr<unsigned char[]>> host_;
  std::vector<void*> device_;
};

// n elements of `dtype` drawn from normal(kBenchInputMean, 1).
std::vector<unsigned char> random_tensor(std::size_t n, gqattn::DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(kBenchInputMean, 1.0f);
  std::vector<unsigned char> out(n * gqattn::dtype_size(dtype));
  for (std::size_t i = 0; i < n; ++i) gqattn::store_from_float(out.data(), dtype, i, normal(rng));
  return out;
}

// One backend's result.
struct BenchRow {
  gqattn::Backend backend = gqattn::Backend::Cpu;
  bool ran = false;
  std::string skipped;           // why it did not run
  std::string backward_skipped;  // why the backward did not (forward-only backend)
  std::string forward_plan, backward_plan;
  double forward_ms = 0.0, backward_ms = 0.0;  // medians; 0 = not timed
  int host_late = 0;  // CUDA: timed calls queued slower than the spin (they include host time)
};

// An explanation's reason without the leading "<backend>: ".
std::string reason_of(const gqattn::Explanation& e, gqattn::Backend b) {
  const std::string prefix = std::string(gqattn::backend_name(b)) + ": ";
  return e.reason.rfind(prefix, 0) == 0 ? e.reason.substr(prefix.size()) : e.reason;
}

bool cpu_backend(gqattn::Backend b) {
  return b == gqattn::Backend::Cpu || b == gqattn::Backend::CpuFlash;
}

}  // namespace

int run_bench(const CheckArgs& c, const BenchArgs& a) {
  const gqattn::Problem& p = c.problem;

  // Problem errors (H % Hkv, window < 0, ...) and lengths that do not fit
  // surface here, before any work.
  const gqattn::Explanation cpu_view =
      gqattn::explain(p, c.dtype, gqattn::Device::cpu, gqattn::Backend::Cpu);
  if (!cpu_view.supported) throw UsageError{cpu_view.reason};
  gqattn::oracle::VarlenLayout layout;
  if (p.varlen) layout = gqattn::check::layout_of(check_config(c, gqattn::Backend::Cpu));

  // The device: --device, else a named backend's, else cuda where usable.
  const bool all = c.backend == "all";
  const gqattn::Backend named = all ? gqattn::Backend::Auto : gqattn::parse_backend(c.backend);
  std::string why_no_gpu;
  std::vector<gqattn::CudaDeviceInfo> gpus;
#ifdef GQATTN_WITH_CUDA
  gpus = gqattn::cuda_devices(&why_no_gpu);
#else
  why_no_gpu = "this build has no CUDA (nvcc was not found at configure time)";
#endif
  std::string device = a.device;
  if (device.empty()) {
    if (!all && named != gqattn::Backend::Auto)
      device = cpu_backend(named) ? "cpu" : "cuda";
    else
      device = gpus.empty() ? "cpu" : "cuda";
  }
  const bool on_cuda = device == "cuda";
  const gqattn::Device dev = on_cuda ? gqattn::Device::cuda : gqattn::Device::cpu;
  if (on_cuda && gpus.empty() && (all || named == gqattn::Backend::Auto))
    throw UsageError{"--device cuda: no usable CUDA device: " + why_no_gpu};

  // Which backends run each pass, and why the others do not.
  gqattn::Options plan_options;
  plan_options.check_offsets = !on_cuda;
  std::vector<BenchRow> rows;
  const std::vector<gqattn::Backend> candidates =
      all ? gqattn::all_backends() : std::vector<gqattn::Backend>{named};
  for (gqattn::Backend b : candidates) {
    BenchRow row;
    row.backend = b;
    const gqattn::Explanation fwd =
        gqattn::explain(p, c.dtype, dev, b, gqattn::Pass::forward, plan_options);
    if (b == gqattn::Backend::Auto && fwd.supported) row.backend = fwd.chosen;
    if (!fwd.supported) {
      if (!all)
        throw UsageError{std::string(gqattn::backend_name(b)) + " is skipped on the " + device +
                         " device: " + reason_of(fwd, b)};
      row.skipped = reason_of(fwd, b);
      rows.push_back(row);
      continue;
    }
    row.ran = true;
    row.forward_plan = fwd.plan;
    if (c.backward) {
      const gqattn::Explanation bwd =
          gqattn::explain(p, c.dtype, dev, row.backend, gqattn::Pass::backward, plan_options);
      if (bwd.supported)
        row.backward_plan = bwd.plan;
      else
        row.backward_skipped = reason_of(bwd, row.backend);
    }
    rows.push_back(row);
  }
  if (std::none_of(rows.begin(), rows.end(), [](const BenchRow& r) { return r.ran; })) {
    std::string why;
    for (const BenchRow& r : rows)
      why +=
          std::string(why.empty() ? "" : "; ") + gqattn::backend_name(r.backend) + ": " + r.skipped;
    throw UsageError{"no backend runs this problem on the " + device + " device: " + why};
  }

  // FLOPs per call, exact from the mask.
  const double pairs = batch_kept_pairs(p, layout);
  const double fwd_flops = kFlopsPerPairPerDim * double(p.d) * double(p.H) * pairs;
  const double bwd_flops = kBackwardFlopFactor * fwd_flops;

  // Shapes and host inputs.
  const int64_t rows_q = p.varlen ? layout.cu_seqlens_q.back() : p.B * p.Tq;
  const int64_t rows_k = p.varlen ? layout.cu_seqlens_k.back() : p.B * p.Tk;
  const std::size_t elem = gqattn::dtype_size(c.dtype);
  const std::size_t q_elems = std::size_t(rows_q * p.H * p.d);
  const std::size_t kv_elems = std::size_t(rows_k * p.Hkv * p.d);
  const std::size_t lse_bytes = std::size_t(p.H * rows_q) * sizeof(float);
  const std::size_t set_bytes = (5 * q_elems + 4 * kv_elems) * elem + lse_bytes;
  const int sets =
      on_cuda
          ? int(std::clamp<std::size_t>(
                (kRotateBytes + set_bytes - 1) / std::max<std::size_t>(set_bytes, 1), 1, kMaxSets))
          : 1;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());

  // The method, in one line (and in JSON).
  char method[512];
  if (on_cuda)
    std::snprintf(method, sizeof method,
                  "cuda device 0 (%s): CUDA events around each call on a private stream, a %d us "
                  "GPU spin queued ahead of every timed call (host launch time excluded); median "
                  "of %d timed calls after %d warm-up calls; %d input set(s) rotated",
                  gpus.empty() ? "?" : gpus.front().name.c_str(), kSpinAheadUs, a.repeats, a.warmup,
                  sets);
  else
    std::snprintf(method, sizeof method,
                  "cpu: wall clock per call (steady_clock); median of %d timed calls after %d "
                  "warm-up calls; %u threads",
                  a.repeats, a.warmup, threads);

  // Time every backend that runs.
  try {
    std::mt19937_64 rng(c.seed);
    const std::vector<unsigned char> hq = random_tensor(q_elems, c.dtype, rng);
    const std::vector<unsigned char> hk = random_tensor(kv_elems, c.dtype, rng);
    const std::vector<unsigned char> hv = random_tensor(kv_elems, c.dtype, rng);
    const std::vector<unsigned char> hdo = random_tensor(q_elems, c.dtype, rng);
    Arena arena(on_cuda);
    struct Set {
      void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    };
    std::vector<Set> all_sets;
    for (int s = 0; s < sets; ++s) {
      Set set;
      set.q = arena.copy_of(hq.data(), hq.size());
      set.k = arena.copy_of(hk.data(), hk.size());
      set.v = arena.copy_of(hv.data(), hv.size());
      set.dout = arena.copy_of(hdo.data(), hdo.size());
      set.o = arena.alloc(q_elems * elem);
      set.lse = arena.alloc(lse_bytes);
      set.dq = arena.alloc(q_elems * elem);
      set.dk = arena.alloc(kv_elems * elem);
      set.dv = arena.alloc(kv_elems * elem);
      all_sets.push_back(set);
    }
    gqattn::VarlenOffsets offsets;
    if (p.varlen) {
      const auto offsets_of = [&](const std::vector<int32_t>& v) {
        return gqattn::OffsetsRef{
            static_cast<const int32_t*>(arena.copy_of(v.data(), v.size() * sizeof(int32_t))), dev,
            int64_t(v.size())};
      };
      offsets.cu_seqlens_q = offsets_of(layout.cu_seqlens_q);
      offsets.cu_seqlens_k = offsets_of(layout.cu_seqlens_k);
      if (!layout.seqused_k.empty()) offsets.seqused_k = offsets_of(layout.seqused_k);
    }
    const auto ref_q = [&](void* data) {
      return p.varlen ? gqattn::contiguous(data, c.dtype, dev, rows_q, p.H, p.d)
                      : gqattn::contiguous(data, c.dtype, dev, p.B, p.Tq, p.H, p.d);
    };
    const auto ref_kv = [&](void* data) {
      return p.varlen ? gqattn::contiguous(data, c.dtype, dev, rows_k, p.Hkv, p.d)
                      : gqattn::contiguous(data, c.dtype, dev, p.B, p.Tk, p.Hkv, p.d);
    };
    const auto ref_lse = [&](void* data) {
      return p.varlen ? gqattn::contiguous(data, gqattn::DType::f32, dev, p.H, rows_q)
                      : gqattn::contiguous(data, gqattn::DType::f32, dev, p.B, p.H, p.Tq);
    };

#ifdef GQATTN_WITH_CUDA
    std::unique_ptr<gqattn_tool::CudaTimer> timer;
    if (on_cuda) timer = std::make_unique<gqattn_tool::CudaTimer>(kSpinAheadUs);
#endif
    for (BenchRow& row : rows) {
      if (!row.ran) continue;
      std::fflush(stdout);
      std::fprintf(stderr, "timing %s ...\n", gqattn::backend_name(row.backend));
      std::fflush(stderr);
      gqattn::Options options;
      options.backend = row.backend;
#ifdef GQATTN_WITH_CUDA
      if (timer) options.stream = timer->stream();
#endif
      const auto forward = [&](const Set& x) {
        if (p.varlen)
          gqattn::forward(p, offsets, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o),
                          ref_lse(x.lse), options);
        else
          gqattn::forward(p, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o), ref_lse(x.lse),
                          options);
      };
      const auto backward = [&](const Set& x) {
        if (p.varlen)
          gqattn::backward(p, offsets, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o),
                           ref_lse(x.lse), ref_q(x.dout), ref_q(x.dq), ref_kv(x.dk), ref_kv(x.dv),
                           options);
        else
          gqattn::backward(p, ref_q(x.q), ref_kv(x.k), ref_kv(x.v), ref_q(x.o), ref_lse(x.lse),
                           ref_q(x.dout), ref_q(x.dq), ref_kv(x.dk), ref_kv(x.dv), options);
      };
      // Warm-up, then the timed calls; the median in ms.
      const auto time_pass = [&](const std::function<void(const Set&)>& call) {
        for (int i = 0; i < a.warmup; ++i) call(all_sets[std::size_t(i % sets)]);
        std::vector<double> ms;
#ifdef GQATTN_WITH_CUDA
        if (timer) {
          timer->synchronize();
          for (int i = 0; i < a.repeats; ++i) {
            const Set& x = all_sets[std::size_t(i % sets)];
            bool late = false;
            ms.push_back(timer->time([&] { call(x); }, &late));
            row.host_late += late ? 1 : 0;
          }
          return median(ms);
        }
#endif
        for (int i = 0; i < a.repeats; ++i) {
          const Set& x = all_sets[std::size_t(i % sets)];
          const auto start = std::chrono::steady_clock::now();
          call(x);
          ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
        }
        return median(ms);
      };
      // Every set's o and lse (the backward's inputs); the offsets are
      // checked on this first call and, on CUDA, not read on the host again.
      for (const Set& x : all_sets) forward(x);
      options.check_offsets = !on_cuda;
      row.forward_ms = time_pass(forward);
      if (c.backward && row.backward_skipped.empty()) row.backward_ms = time_pass(backward);
#ifdef GQATTN_WITH_CUDA
      if (timer) timer->synchronize();
#endif
    }
  } catch (const std::exception& e) {
    // The arguments were valid: whatever fails now is a runtime failure.
    std::fflush(stdout);
    std::fprintf(stderr, "gqattn: bench: error while running: %s\n", e.what());
    return kExitRuntime;
  }

  // The fastest of each pass, for the ratios.
  double best_fwd = 0.0, best_bwd = 0.0;
  int host_late = 0;
  for (const BenchRow& r : rows) {
    if (r.forward_ms > 0.0 && (best_fwd == 0.0 || r.forward_ms < best_fwd)) best_fwd = r.forward_ms;
    if (r.backward_ms > 0.0 && (best_bwd == 0.0 || r.backward_ms < best_bwd))
      best_bwd = r.backward_ms;
    host_late += r.host_late;
  }
  const double unit = on_cuda ? 1e12 : 1e9;  // TFLOP/s on CUDA, GFLOP/s on the CPU
  const auto rate = [&](double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e-3) : 0.0; };

  if (c.json) {
    std::vector<std::string> results;
    for (const BenchRow& r : rows) {
      const bool bwd = r.backward_ms > 0.0;
      const auto num_or_null = [](bool present, double v) {
        return present ? json_number(v) : std::string("null");
      };
      results.push_back(
          JsonObject()
              .str("backend", gqattn::backend_name(r.backend))
              .boolean("ran", r.ran)
              .str("skipped", r.skipped)
              .str("backward_skipped", r.backward_skipped)
              .str("forward_plan", r.forward_plan)
              .str("backward_plan", r.backward_plan)
              .add("forward_ms", num_or_null(r.ran, r.forward_ms))
              .add("forward_tflops", num_or_null(r.ran, rate(fwd_flops, r.forward_ms) / 1e12))
              .add("forward_gflops", num_or_null(r.ran, rate(fwd_flops, r.forward_ms) / 1e9))
              .add("forward_vs_fastest", num_or_null(r.ran, r.forward_ms / best_fwd))
              .add("backward_ms", num_or_null(bwd, r.backward_ms))
              .add("backward_tflops", num_or_null(bwd, rate(bwd_flops, r.backward_ms) / 1e12))
              .add("backward_gflops", num_or_null(bwd, rate(bwd_flops, r.backward_ms) / 1e9))
              .add("backward_vs_fastest", num_or_null(bwd, r.backward_ms / best_bwd))
              .add("host_late_calls", json_int(r.host_late))
              .done());
    }
    std::printf("%s\n", JsonObject()
                            .add("problem", problem_json(c))
                            .str("device", device)
                            .str("method", method)
                            .str("timer", on_cuda ? "cuda-events" : "steady-clock")
                            .add("spin_ahead_us", on_cuda ? json_int(kSpinAheadUs) : "null")
                            .add("repeats", json_int(a.repeats))
                            .add("warmup", json_int(a.warmup))
                            .add("threads", on_cuda ? "null" : json_int(threads))
                            .add("input_sets", json_int(sets))
                            .add("kept_pairs", json_number(pairs))
                            .add("forward_flops", json_number(fwd_flops))
                            .add("backward_flops", json_number(c.backward ? bwd_flops : 0.0))
                            .add("results", json_array(results))
                            .done()
                            .c_str());
    return 0;
  }

  std::printf(
      "problem: B=%lld Tq=%lld Tk=%lld H=%lld Hkv=%lld d=%lld causal=%d window=%lld softcap=%g "
      "scale=%g q_start=%s dtype=%s%s\n",
      (long long)p.B, (long long)p.Tq, (long long)p.Tk, (long long)p.H, (long long)p.Hkv,
      (long long)p.d, p.causal ? 1 : 0, (long long)p.window, double(p.softcap),
      double(p.effective_scale()),
      p.q_start ? std::to_string(*p.q_start).c_str() : (p.varlen ? "Tk_b-Tq_b" : "Tk-Tq"),
      gqattn::dtype_name(c.dtype), p.varlen ? " varlen" : "");
  if (p.varlen)
    std::printf("varlen: cu_seqlens_q=%s cu_seqlens_k=%s seqused_k=%s\n",
                lengths_text(layout.cu_seqlens_q).c_str(),
                lengths_text(layout.cu_seqlens_k).c_str(),
                layout.seqused_k.empty() ? "none" : lengths_text(layout.seqused_k).c_str());
  std::printf("flops: forward %.4g per call (4 * d * H * %.0f kept pairs), backward 2.5x\n",
              fwd_flops, pairs);
  std::printf("method: %s\n\n", method);
  const char* unit_name = on_cuda ? "TFLOP/s" : "GFLOP/s";
  std::printf("%-13s %10s %11s %8s %10s %11s %8s\n", "backend", "fwd ms", unit_name, "fwd x",
              "bwd ms", unit_name, "bwd x");
  for (const BenchRow& r : rows) {
    if (!r.ran) continue;
    std::printf("%-13s %10.4f %11.3f %7.2fx", gqattn::backend_name(r.backend), r.forward_ms,
                rate(fwd_flops, r.forward_ms) / unit, r.forward_ms / best_fwd);
    if (r.backward_ms > 0.0)
      std::printf(" %10.4f %11.3f %7.2fx\n", r.backward_ms, rate(bwd_flops, r.backward_ms) / unit,
                  r.backward_ms / best_bwd);
    else
      std::printf(" %10s %11s %8s\n", "-", "-", "-");
  }
  std::printf("(x: time / the fastest backend's time; 1.00x = the fastest)\n");
  for (const BenchRow& r : rows) {
    if (!r.ran)
      std::printf("%-13s skipped: %s\n", gqattn::backend_name(r.backend), r.skipped.c_str());
    else if (c.backward && !r.backward_skipped.empty())
      std::printf("%-13s backward skipped: %s\n", gqattn::backend_name(r.backend),
                  r.backward_skipped.c_str());
  }
  if (host_late > 0)
    std::printf(
        "note: %d timed call(s) took the host longer to queue than the %d us spin: "
        "their times include host time\n",
        host_late, kSpinAheadUs);
  return 0;
}

}  // namespace gqattn_cli
