// The checker behind `gqattn check` and the correctness tests: a backend's
// forward and backward on fresh random inputs, against the f64 oracle on the
// same (dtype-rounded) inputs, with the tolerances of check.hpp.
#include "gqattn/check.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "check/staging.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/oracle.hpp"

namespace gqattn::check {
namespace {

constexpr double kF32Rounding = 1.0 / 16777216.0;  // 2^-24
constexpr double kBf16Rounding = 1.0 / 256.0;      // 2^-8: one bf16 rounding, relative
constexpr double kF16Rounding = 1.0 / 2048.0;      // 2^-11
constexpr float kInputMean = 0.5f;                 // non-zero: softmax and dS must not cancel
// A few q rows this much larger, to exercise the softmax's max tracking.
// (x8 puts even the exact f32 mirror above 1e-5 at d = 256: the error of an
// f32 dot product grows with the logits' size.)
constexpr float kLargeRowFactor = 4.0f;
constexpr int64_t kLargeRowEvery = 7;

struct Inputs {
  std::vector<float> q, k, v, dout;  // packed, already rounded to the I/O dtype
};

float rounded(float x, DType dtype) {
  switch (dtype) {
    case DType::f32: return x;
    case DType::bf16: return bf16_to_float(float_to_bf16(x));
    case DType::f16: return f16_to_float(float_to_f16(x));
  }
  return x;
}

Inputs make_inputs(const Config& c) {
  const Problem& p = c.problem;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(kInputMean, 1.0f);
  auto fill = [&](int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = rounded(normal(rng), c.dtype);
    return x;
  };
  Inputs in;
  in.q = fill(p.B * p.Tq * p.H * p.d);
  in.k = fill(p.B * p.Tk * p.Hkv * p.d);
  in.v = fill(p.B * p.Tk * p.Hkv * p.d);
  in.dout = fill(p.B * p.Tq * p.H * p.d);
  if (c.large_rows) {
    // q rows are [d] runs of the packed [B, Tq, H, d] array.
    for (int64_t row = 0; row < p.B * p.Tq * p.H; row += kLargeRowEvery)
      for (int64_t e = 0; e < p.d; ++e) {
        float& x = in.q[std::size_t(row * p.d + e)];
        x = rounded(x * kLargeRowFactor, c.dtype);
      }
  }
  return in;
}

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
  std::vector<std::vector<uint8_t>> bits;  // raw buffers, for determinism
  double forward_ms = 0.0, backward_ms = 0.0;
};

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
      .count();
}

// `o_rounding`: the dtype whose rounding o gets before it enters backward.
// The f32 yardstick for 16-bit I/O uses it: a 16-bit backend's backward
// receives its o rounded to 16 bits, and that o is an input of backward.
Outputs run_backend(const Config& c, Backend backend, DType dtype, Device device, const Inputs& in,
                    DType o_rounding) {
  const Problem& p = c.problem;
  const bool pad = c.padded_strides;
  auto staged = [&](DType t, std::vector<int64_t> shape) {
    return std::make_unique<StagedTensor>(t, device, std::move(shape), pad);
  };
  auto q = staged(dtype, {p.B, p.Tq, p.H, p.d});
  auto k = staged(dtype, {p.B, p.Tk, p.Hkv, p.d});
  auto v = staged(dtype, {p.B, p.Tk, p.Hkv, p.d});
  auto o = staged(dtype, {p.B, p.Tq, p.H, p.d});
  auto lse = staged(DType::f32, {p.B, p.H, p.Tq});
  q->upload(in.q);
  k->upload(in.k);
  v->upload(in.v);
  Options options;
  options.backend = backend;
  options.deterministic = c.deterministic;

  Outputs out;
  auto start = std::chrono::steady_clock::now();
  forward(p, q->ref(), k->ref(), v->ref(), o->ref(), lse->ref(), options);
  synchronize(device);
  out.forward_ms = elapsed_ms(start);
  out.o = o->download();
  out.lse = lse->download();
  out.bits.push_back(o->bytes());
  out.bits.push_back(lse->bytes());
  if (!c.backward) return out;
  if (o_rounding != dtype) {
    std::vector<float> o_rounded = out.o;
    for (float& x : o_rounded) x = rounded(x, o_rounding);
    o->upload(o_rounded);
  }

  auto dout = staged(dtype, {p.B, p.Tq, p.H, p.d});
  auto dq = staged(dtype, {p.B, p.Tq, p.H, p.d});
  auto dk = staged(dtype, {p.B, p.Tk, p.Hkv, p.d});
  auto dv = staged(dtype, {p.B, p.Tk, p.Hkv, p.d});
  dout->upload(in.dout);
  start = std::chrono::steady_clock::now();
  gqattn::backward(p, q->ref(), k->ref(), v->ref(), o->ref(), lse->ref(), dout->ref(), dq->ref(),
                   dk->ref(), dv->ref(), options);
  synchronize(device);
  out.backward_ms = elapsed_ms(start);
  out.dq = dq->download();
  out.dk = dk->download();
  out.dv = dv->download();
  out.bits.push_back(dq->bytes());
  out.bits.push_back(dk->bytes());
  out.bits.push_back(dv->bytes());
  return out;
}

// max |x - ref| / max |ref|; NaN or a mismatched infinity counts as failure.
Metric compare(const std::string& name, const std::vector<float>& x,
               const std::vector<double>& ref) {
  Metric m;
  m.name = name;
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i];
    const double value = double(x[i]);
    if (std::isnan(value)) {
      m.error = std::numeric_limits<double>::infinity();
      m.note = "NaN at index " + std::to_string(i) + " (unwritten or invalid)";
      return m;
    }
    if (std::isinf(r) || std::isinf(value)) {
      if (r != value) {
        m.error = std::numeric_limits<double>::infinity();
        m.note = "index " + std::to_string(i) + ": " + std::to_string(value) + ", expected " +
                 std::to_string(r);
        return m;
      }
      continue;  // both -inf: a row with no kept key, as required
    }
    max_ref = std::max(max_ref, std::fabs(r));
    max_diff = std::max(max_diff, std::fabs(value - r));
  }
  m.error = max_ref > 0.0 ? max_diff / max_ref : max_diff;
  return m;
}

std::vector<Metric> compare_all(const Outputs& out, const oracle::ForwardResult& fwd,
                                const oracle::Gradients* grads) {
  std::vector<Metric> metrics = {compare("o", out.o, fwd.o), compare("lse", out.lse, fwd.lse)};
  if (grads != nullptr) {
    metrics.push_back(compare("dq", out.dq, grads->dq));
    metrics.push_back(compare("dk", out.dk, grads->dk));
    metrics.push_back(compare("dv", out.dv, grads->dv));
  }
  return metrics;
}

Device device_of(Backend backend) {
  if (backend == Backend::Cpu) return Device::cpu;
  if (backend != Backend::Auto) return Device::cuda;
  return cuda_devices().empty() ? Device::cpu : Device::cuda;
}

}  // namespace

// The check proper, once run() has settled which passes the backend takes.
static Report run_checked(const Config& c, Device device, Report report) {
  const Inputs in = make_inputs(c);
  const oracle::ForwardResult fwd =
      oracle::forward(c.problem, widen(in.q), widen(in.k), widen(in.v));
  oracle::Gradients grads;
  if (c.backward)
    grads = oracle::backward(c.problem, widen(in.q), widen(in.k), widen(in.v), widen(in.dout));
  const oracle::Gradients* grads_or_null = c.backward ? &grads : nullptr;

  const Outputs out = run_backend(c, report.backend, c.dtype, device, in, c.dtype);
  report.ran = true;
  report.metrics = compare_all(out, fwd, grads_or_null);
  report.forward_ms = out.forward_ms;
  report.backward_ms = out.backward_ms;

  // Tolerances. For 16-bit I/O the yardstick is the same math in f32 on the
  // same rounded inputs (the CPU mirror; its backward gets o rounded like the
  // backend's), doubled, plus the roundings the 16-bit result goes through:
  // the output's own, and for o, dq, dk, dv the 16-bit operand (P or dS) of
  // the tensor-core product that forms them, as in every fused attention
  // kernel (FlashAttention 2/3, cuDNN). Where few terms are summed those
  // operand roundings add up coherently: e.g. dv at T = 64, H = 1, d = 256
  // reaches 4.1e-3 in bf16 with an exact kernel that rounds P (a float64
  // model of it), above one rounding (2^-8 = 3.9e-3). lse is f32 from f32
  // scores: one rounding.
  // f32 is judged the same way: its yardstick is the f32 mirror's own
  // error, so long rows (whose f32 error grows with T) pass when the backend
  // does as well as the seed's algorithm.
  std::vector<double> limits(report.metrics.size(), 0.0);
  {
    const Outputs mirror = run_backend(c, Backend::Cpu, DType::f32, Device::cpu, in, c.dtype);
    const std::vector<Metric> baseline = compare_all(mirror, fwd, grads_or_null);
    for (std::size_t i = 0; i < baseline.size(); ++i)
      limits[i] = tolerance(c.dtype, baseline[i].name, baseline[i].error);
  }
  bool all_pass = true;
  for (std::size_t i = 0; i < report.metrics.size(); ++i) {
    Metric& m = report.metrics[i];
    m.tolerance = limits[i];
    m.pass = m.error <= m.tolerance;
    all_pass = all_pass && m.pass;
  }

  if (c.determinism && c.deterministic) {
    const Outputs again = run_backend(c, report.backend, c.dtype, device, in, c.dtype);
    report.deterministic = again.bits == out.bits;
    // The second run is warm: report its times.
    report.forward_ms = again.forward_ms;
    report.backward_ms = again.backward_ms;
  }
  report.pass = all_pass && report.deterministic;
  return report;
}

double tolerance(DType dtype, const std::string& name, double mirror_error) {
  if (dtype == DType::f32) return 2.0 * mirror_error + kF32Rounding;
  const double rounding = dtype == DType::bf16 ? kBf16Rounding : kF16Rounding;
  const double roundings = name == "lse" ? 1.0 : 2.0;
  return 2.0 * mirror_error + roundings * rounding;
}

Report run(const Config& c) {
  Report report;
  report.backend = c.backend;
  const Device device = device_of(c.backend);
  const Explanation why = explain(c.problem, c.dtype, device, c.backend);
  if (!why.supported) {
    report.skipped = why.reason;
    return report;
  }
  report.backend = why.chosen;
  Config effective = c;
  if (c.backward) {
    const Explanation why_backward =
        explain(c.problem, c.dtype, device, report.backend, Pass::backward);
    if (!why_backward.supported) {
      report.backward_skipped = why_backward.reason;
      effective.backward = false;
    }
  }
  return run_checked(effective, device, report);
}

}  // namespace gqattn::check
