// The checker behind `gqattn check` and the correctness tests: a backend's
// forward and backward on fresh random inputs, against the f64 oracle on the
// same (dtype-rounded) inputs, with the tolerances of check.hpp. Dense
// problems and varlen batches share every step; they differ only in the
// tensors' shapes (Shapes below), the offsets staged beside them, and which
// oracle entry point is the reference. Checked by tests/cpu/test_check*.cpp.
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
#include "gqattn/error.hpp"
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
// Varlen lengths come from their own stream of the seed, so that the inputs
// of a seed do not shift with the lengths drawn before them.
constexpr uint64_t kLayoutStream = 0x9e3779b97f4a7c15ull;

// The packed rows of each tensor: [B * Tq] and [B * Tk] for a dense problem,
// [total_q] and [total_k] for a varlen batch.
struct Shapes {
  bool varlen = false;
  int64_t q_rows = 0, k_rows = 0;
  std::vector<int64_t> q, k, lse;  // q, o, do, dq; k, v, dk, dv; lse
};

Shapes shapes_of(const Problem& p, const oracle::VarlenLayout& layout) {
  Shapes s;
  s.varlen = p.varlen;
  if (p.varlen) {
    s.q_rows = layout.cu_seqlens_q.back();
    s.k_rows = layout.cu_seqlens_k.back();
    s.q = {s.q_rows, p.H, p.d};
    s.k = {s.k_rows, p.Hkv, p.d};
    s.lse = {p.H, s.q_rows};
  } else {
    s.q_rows = p.B * p.Tq;
    s.k_rows = p.B * p.Tk;
    s.q = {p.B, p.Tq, p.H, p.d};
    s.k = {p.B, p.Tk, p.Hkv, p.d};
    s.lse = {p.B, p.H, p.Tq};
  }
  return s;
}

// A length in [0, max]: 0, 1 and max each a sixth of the time (the edges
// of every kernel: no rows, one row, a full tile count), else uniform.
int32_t draw_length(std::mt19937_64& rng, int64_t max) {
  const int64_t pick = std::uniform_int_distribution<int64_t>(0, 5)(rng);
  int64_t n = 0;
  if (pick == 0)
    n = 0;
  else if (pick == 1)
    n = 1;
  else if (pick == 2)
    n = max;
  else
    n = std::uniform_int_distribution<int64_t>(0, max)(rng);
  return int32_t(std::min<int64_t>(n, max));
}

std::vector<int32_t> offsets_of(const std::vector<int32_t>& lengths, const char* name) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  int64_t total = 0;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    total += lengths[b];
    if (total > std::numeric_limits<int32_t>::max())
      throw Error(name, "the packed rows must number less than 2^31");
    cu[b + 1] = int32_t(total);
  }
  return cu;
}

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

Inputs make_inputs(const Config& c, const Shapes& s) {
  const Problem& p = c.problem;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(kInputMean, 1.0f);
  auto fill = [&](int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = rounded(normal(rng), c.dtype);
    return x;
  };
  Inputs in;
  in.q = fill(s.q_rows * p.H * p.d);
  in.k = fill(s.k_rows * p.Hkv * p.d);
  in.v = fill(s.k_rows * p.Hkv * p.d);
  in.dout = fill(s.q_rows * p.H * p.d);
  if (c.large_rows) {
    // q rows are [d] runs of the packed [B, Tq, H, d] (or [total_q, H, d])
    // array.
    for (int64_t row = 0; row < s.q_rows * p.H; row += kLargeRowEvery)
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

// What one backend run is given: the problem and (varlen) its offsets.
struct Call {
  Problem problem;
  oracle::VarlenLayout layout;  // varlen only
};

// `o_rounding`: the dtype whose rounding o gets before it enters backward.
// The f32 yardstick for 16-bit I/O uses it: a 16-bit backend's backward
// receives its o rounded to 16 bits, and that o is an input of backward.
Outputs run_backend(const Config& c, const Call& call, Backend backend, DType dtype, Device device,
                    const Inputs& in, DType o_rounding) {
  const Problem& p = call.problem;
  const Shapes shapes = shapes_of(p, call.layout);
  const bool pad = c.padded_strides;
  auto staged = [&](DType t, std::vector<int64_t> shape) {
    return std::make_unique<StagedTensor>(t, device, std::move(shape), pad);
  };
  auto q = staged(dtype, shapes.q);
  auto k = staged(dtype, shapes.k);
  auto v = staged(dtype, shapes.k);
  auto o = staged(dtype, shapes.q);
  auto lse = staged(DType::f32, shapes.lse);
  q->upload(in.q);
  k->upload(in.k);
  v->upload(in.v);
  // The offsets live on the tensors' device, as the API requires.
  const StagedOffsets cu_q(call.layout.cu_seqlens_q, device);
  const StagedOffsets cu_k(call.layout.cu_seqlens_k, device);
  const StagedOffsets used_k(call.layout.seqused_k, device);
  const VarlenOffsets offsets{cu_q.ref(), cu_k.ref(), used_k.ref()};
  Options options;
  options.backend = backend;
  options.deterministic = c.deterministic;
  options.check_offsets = c.varlen.check_offsets;

  Outputs out;
  auto start = std::chrono::steady_clock::now();
  if (shapes.varlen)
    forward(p, offsets, q->ref(), k->ref(), v->ref(), o->ref(), lse->ref(), options);
  else
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

  auto dout = staged(dtype, shapes.q);
  auto dq = staged(dtype, shapes.q);
  auto dk = staged(dtype, shapes.k);
  auto dv = staged(dtype, shapes.k);
  dout->upload(in.dout);
  start = std::chrono::steady_clock::now();
  if (shapes.varlen)
    gqattn::backward(p, offsets, q->ref(), k->ref(), v->ref(), o->ref(), lse->ref(), dout->ref(),
                     dq->ref(), dk->ref(), dv->ref(), options);
  else
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
  if (backend == Backend::Cpu || backend == Backend::CpuFlash) return Device::cpu;
  if (backend != Backend::Auto) return Device::cuda;
  return cuda_devices().empty() ? Device::cpu : Device::cuda;
}

}  // namespace

// The check proper, once run() has settled which passes the backend takes.
static Report run_checked(const Config& c, Device device, Report report) {
  // The truth (oracle and mirror) and what the backend under test is given:
  // the same, unless a test misleads the backend on purpose.
  Call truth{c.problem, {}};
  if (c.problem.varlen) truth.layout = layout_of(c);
  Call tested = truth;
  if (c.mislead_backend) c.mislead_backend(tested.problem, tested.layout);

  const Inputs in = make_inputs(c, shapes_of(truth.problem, truth.layout));
  const Problem& p = truth.problem;
  const oracle::ForwardResult fwd =
      p.varlen ? oracle::forward_varlen(p, truth.layout, widen(in.q), widen(in.k), widen(in.v))
               : oracle::forward(p, widen(in.q), widen(in.k), widen(in.v));
  oracle::Gradients grads;
  if (c.backward)
    grads = p.varlen ? oracle::backward_varlen(p, truth.layout, widen(in.q), widen(in.k),
                                               widen(in.v), widen(in.dout))
                     : oracle::backward(p, widen(in.q), widen(in.k), widen(in.v), widen(in.dout));
  const oracle::Gradients* grads_or_null = c.backward ? &grads : nullptr;

  const Outputs out = run_backend(c, tested, report.backend, c.dtype, device, in, c.dtype);
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
    const Outputs mirror =
        run_backend(c, truth, Backend::Cpu, DType::f32, Device::cpu, in, c.dtype);
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
    const Outputs again = run_backend(c, tested, report.backend, c.dtype, device, in, c.dtype);
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

oracle::VarlenLayout layout_of(const Config& c) {
  const Problem& p = c.problem;
  const VarlenConfig& v = c.varlen;
  if (v.seqlens_q.empty() != v.seqlens_k.empty())
    throw Error("seqlens_q, seqlens_k", "give both or neither (neither: drawn from the seed)");
  std::mt19937_64 rng(c.seed ^ kLayoutStream);
  std::vector<int32_t> lq = v.seqlens_q, lk = v.seqlens_k;
  if (lq.empty()) {
    for (int64_t b = 0; b < p.B; ++b) {
      lq.push_back(draw_length(rng, p.Tq));
      lk.push_back(draw_length(rng, p.Tk));
    }
  }
  const auto fits = [&](const char* name, const std::vector<int32_t>& lengths, int64_t max) {
    if (int64_t(lengths.size()) != p.B)
      throw Error(name, "needs B = " + std::to_string(p.B) + " lengths, got " +
                            std::to_string(lengths.size()));
    for (int32_t n : lengths)
      if (n < 0 || n > max)
        throw Error(name,
                    "length " + std::to_string(n) + " is not in [0, " + std::to_string(max) + "]");
  };
  fits("seqlens_q", lq, p.Tq);
  fits("seqlens_k", lk, p.Tk);
  oracle::VarlenLayout layout;
  layout.cu_seqlens_q = offsets_of(lq, "seqlens_q");
  layout.cu_seqlens_k = offsets_of(lk, "seqlens_k");
  layout.seqused_k = v.seqused_k;
  if (layout.seqused_k.empty() && v.draw_seqused_k)
    for (int32_t n : lk) layout.seqused_k.push_back(draw_length(rng, n));
  if (!layout.seqused_k.empty()) {
    if (int64_t(layout.seqused_k.size()) != p.B)
      throw Error("seqused_k", "needs B = " + std::to_string(p.B) + " values, got " +
                                   std::to_string(layout.seqused_k.size()));
    for (int64_t b = 0; b < p.B; ++b)
      if (layout.seqused_k[std::size_t(b)] < 0 ||
          layout.seqused_k[std::size_t(b)] > lk[std::size_t(b)])
        throw Error("seqused_k", "value " + std::to_string(layout.seqused_k[std::size_t(b)]) +
                                     " of sequence " + std::to_string(b) + " is not in [0, " +
                                     std::to_string(lk[std::size_t(b)]) + "]");
  }
  return layout;
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
