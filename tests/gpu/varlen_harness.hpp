// A harness for varlen batches (Problem::varlen) through the public API, on
// any backend: packed inputs rounded to the I/O dtype, every tensor inside a
// larger buffer whose guard bytes before and after it are poisoned (and
// checked untouched afterwards), outputs NaN-poisoned, offsets staged on
// the tensors' device; the f64 oracle per sequence, and the f32 CPU mirror
// per sequence for the tolerance of check.hpp (2 x the mirror's error + the
// dtype's roundings). Header-only; used by tests/gpu/test_varlen.cpp.
// Works on host memory too (Backend::Cpu), so the harness itself runs
// wherever the GPU suite is built.
#pragma once

#ifdef GQATTN_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/oracle.hpp"

namespace gqattn::test::varlen {

// ---- buffers -------------------------------------------------------------------

// Guard bytes on each side of a tensor: a multiple of 256, so the tensor
// keeps the alignment of the allocation (TMA and 16-byte loads need it).
constexpr std::size_t kGuardBytes = 1024;

// A tensor's bytes (`payload`) between two guards, on the host or a CUDA
// device; all of it starts as the poison pattern (NaN in every dtype).
class GuardedBuffer {
 public:
  GuardedBuffer(Device device, std::size_t payload_bytes)
      : device_(device), payload_(payload_bytes) {
    const std::size_t total = payload_ + 2 * kGuardBytes;
    if (device_ == Device::cuda) {
      device_buffer_ = DeviceBuffer(total);
      device_buffer_.poison();
    } else {
      host_.assign(total, static_cast<unsigned char>(kPoisonByte));
    }
  }
  void* data() {
    unsigned char* base =
        device_ == Device::cuda ? static_cast<unsigned char*>(device_buffer_.get()) : host_.data();
    return base + kGuardBytes;
  }
  void upload(const std::vector<unsigned char>& payload) {
    if (payload.size() != payload_) throw std::runtime_error("GuardedBuffer: payload size");
    if (payload_ == 0) return;
    if (device_ == Device::cuda)
      cuda_ok(cudaMemcpy(data(), payload.data(), payload_, cudaMemcpyHostToDevice), "upload");
    else
      std::memcpy(data(), payload.data(), payload_);
  }
  // Every byte, guards included (synchronous).
  std::vector<unsigned char> all() const {
    if (device_ == Device::cuda) return device_buffer_.download<unsigned char>();
    return host_;
  }

 private:
  Device device_;
  std::size_t payload_;
  DeviceBuffer device_buffer_;
  std::vector<unsigned char> host_;
};

// An int32 vector on a device (no guards: the backends only read it).
class Int32Vector {
 public:
  Int32Vector(Device device, const std::vector<int32_t>& values) : device_(device), host_(values) {
    if (device_ == Device::cuda && !values.empty()) device_buffer_ = to_device(values);
  }
  OffsetsRef ref() const {
    OffsetsRef r;
    r.device = device_;
    r.size = int64_t(host_.size());
    if (host_.empty()) return r;  // absent (seqused_k)
    r.data =
        device_ == Device::cuda ? static_cast<const int32_t*>(device_buffer_.get()) : host_.data();
    return r;
  }

 private:
  Device device_;
  std::vector<int32_t> host_;
  DeviceBuffer device_buffer_;
};

inline std::vector<unsigned char> encode(DType dtype, const std::vector<float>& values) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
  for (std::size_t e = 0; e < values.size(); ++e)
    store_from_float(bytes.data(), dtype, e, values[e]);
  return bytes;
}

inline std::vector<float> decode(DType dtype, const unsigned char* bytes, std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t e = 0; e < count; ++e) values[e] = load_as_float(bytes, dtype, e);
  return values;
}

inline bool is_poison(const unsigned char* bytes, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (bytes[i] != static_cast<unsigned char>(kPoisonByte)) return false;
  return true;
}

// ---- a batch -------------------------------------------------------------------

// A varlen batch and its inputs (packed, already rounded to `dtype`).
struct Batch {
  Problem problem;  // varlen, B, Tq = max_seqlen_q, Tk = max_seqlen_k
  oracle::VarlenLayout layout;
  DType dtype = DType::bf16;
  std::vector<float> q, k, v, dout;
  int64_t total_q() const { return layout.cu_seqlens_q.back(); }
  int64_t total_k() const { return layout.cu_seqlens_k.back(); }
  int64_t tq(int64_t b) const { return layout.cu_seqlens_q[b + 1] - layout.cu_seqlens_q[b]; }
  int64_t packed_k(int64_t b) const { return layout.cu_seqlens_k[b + 1] - layout.cu_seqlens_k[b]; }
  // Keys sequence b uses (seqused_k, else its packed keys).
  int64_t tk(int64_t b) const {
    return layout.seqused_k.empty() ? packed_k(b) : layout.seqused_k[std::size_t(b)];
  }
};

// Input distribution of gqattn::check (check.cpp): N(0.5, 1) rounded to the
// dtype, every 7th row of q (a row: one token of one head) four times larger.
constexpr float kInputMean = 0.5f;
constexpr int64_t kLargeRowEvery = 7;
constexpr float kLargeRowFactor = 4.0f;

inline float rounded(DType dtype, float x) {
  unsigned char bytes[sizeof(float)];
  store_from_float(bytes, dtype, 0, x);
  return load_as_float(bytes, dtype, 0);
}

// `base`: heads, d, mask, softcap, scale, q_start. `lengths`: (queries,
// packed keys) per sequence; `used`: seqused_k or empty. Tq, Tk become the
// longest sequences (at least 1).
inline Batch make_batch(const Problem& base,
                        const std::vector<std::pair<int32_t, int32_t>>& lengths,
                        const std::vector<int32_t>& used, DType dtype, uint64_t seed) {
  Batch b;
  b.dtype = dtype;
  b.problem = base;
  b.problem.varlen = true;
  b.problem.B = int64_t(lengths.size());
  b.problem.Tq = 1;
  b.problem.Tk = 1;
  b.layout.cu_seqlens_q = {0};
  b.layout.cu_seqlens_k = {0};
  for (const auto& [tq, tk] : lengths) {
    b.layout.cu_seqlens_q.push_back(b.layout.cu_seqlens_q.back() + tq);
    b.layout.cu_seqlens_k.push_back(b.layout.cu_seqlens_k.back() + tk);
    b.problem.Tq = std::max<int64_t>(b.problem.Tq, tq);
    b.problem.Tk = std::max<int64_t>(b.problem.Tk, tk);
  }
  b.layout.seqused_k = used;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(kInputMean, 1.0f);
  const Problem& p = b.problem;
  auto fill = [&](std::vector<float>& x, int64_t rows, bool large_rows) {
    x.resize(std::size_t(rows * p.d));
    for (int64_t r = 0; r < rows; ++r) {
      const float gain = large_rows && r % kLargeRowEvery == 0 ? kLargeRowFactor : 1.0f;
      for (int64_t e = 0; e < p.d; ++e)
        x[std::size_t(r * p.d + e)] = rounded(dtype, gain * normal(rng));
    }
  };
  fill(b.q, b.total_q() * p.H, true);
  fill(b.k, b.total_k() * p.Hkv, false);
  fill(b.v, b.total_k() * p.Hkv, false);
  fill(b.dout, b.total_q() * p.H, false);
  return b;
}

// Sequence b alone: a batch of one with b's rows and lengths, and the
// batch's problem otherwise (max_seqlen_q/k and q_start included, so that
// only the company of other sequences differs).
inline Batch alone(const Batch& batch, int64_t b) {
  Batch one;
  one.dtype = batch.dtype;
  one.problem = batch.problem;
  one.problem.B = 1;
  const Problem& p = batch.problem;
  const int64_t q0 = batch.layout.cu_seqlens_q[b], k0 = batch.layout.cu_seqlens_k[b];
  const int64_t tq = batch.tq(b), tk = batch.packed_k(b);
  one.layout.cu_seqlens_q = {0, int32_t(tq)};
  one.layout.cu_seqlens_k = {0, int32_t(tk)};
  if (!batch.layout.seqused_k.empty()) one.layout.seqused_k = {batch.layout.seqused_k[b]};
  auto slice = [](const std::vector<float>& x, int64_t first, int64_t count) {
    return std::vector<float>(x.begin() + first, x.begin() + first + count);
  };
  one.q = slice(batch.q, q0 * p.H * p.d, tq * p.H * p.d);
  one.dout = slice(batch.dout, q0 * p.H * p.d, tq * p.H * p.d);
  one.k = slice(batch.k, k0 * p.Hkv * p.d, tk * p.Hkv * p.d);
  one.v = slice(batch.v, k0 * p.Hkv * p.d, tk * p.Hkv * p.d);
  return one;
}

// ---- runs ----------------------------------------------------------------------

// One output's payload bytes, and whether its guards were untouched.
struct Output {
  std::vector<unsigned char> bytes;
  bool guards_intact = true;
};

inline Output read_output(GuardedBuffer& buffer, std::size_t payload_bytes) {
  const std::vector<unsigned char> all = buffer.all();
  Output out;
  out.guards_intact = is_poison(all.data(), kGuardBytes) &&
                      is_poison(all.data() + kGuardBytes + payload_bytes, kGuardBytes);
  out.bytes.assign(all.begin() + std::ptrdiff_t(kGuardBytes),
                   all.begin() + std::ptrdiff_t(kGuardBytes + payload_bytes));
  return out;
}

struct RunResult {
  DType dtype = DType::bf16;
  Output o, lse, dq, dk, dv;
  bool backward_ran = false;
  std::string forward_error, backward_error;  // spec.catch_errors: what was thrown
  bool guards_intact() const {
    return o.guards_intact && lse.guards_intact && dq.guards_intact && dk.guards_intact &&
           dv.guards_intact;
  }
  std::vector<float> values(const Output& x, DType t) const {
    return decode(t, x.bytes.data(), x.bytes.size() / dtype_size(t));
  }
  std::vector<float> o_values() const { return values(o, dtype); }
  std::vector<float> lse_values() const { return values(lse, DType::f32); }
  std::vector<float> dq_values() const { return values(dq, dtype); }
  std::vector<float> dk_values() const { return values(dk, dtype); }
  std::vector<float> dv_values() const { return values(dv, dtype); }
};

struct RunSpec {
  Backend backend = Backend::Cpu;
  DType dtype = DType::bf16;  // the backend's I/O dtype (the inputs are already rounded)
  bool backward = true;
  // The dtype o is rounded to before it enters backward (the mirror's
  // backward gets o as a 16-bit backend's does; check.cpp does the same).
  DType o_rounding = DType::bf16;
  bool check_offsets = true;
  // The offsets the backend is given, when not the batch's own (tests of
  // wrong offsets: the tensors keep the batch's sizes).
  const oracle::VarlenLayout* given = nullptr;
  // Record a gqattn::Error of either call (then read the outputs anyway)
  // instead of letting it propagate.
  bool catch_errors = false;
};

inline Device device_of(Backend backend) {
  return backend == Backend::Cpu ? Device::cpu : Device::cuda;
}

inline TensorRef packed(GuardedBuffer& buffer, DType dtype, Device device, int64_t rows,
                        int64_t heads, int64_t d) {
  return contiguous(rows == 0 ? nullptr : buffer.data(), dtype, device, rows, heads, d);
}

inline TensorRef lse_ref(GuardedBuffer& buffer, Device device, int64_t H, int64_t total_q) {
  TensorRef t;
  t.data = total_q == 0 ? nullptr : buffer.data();
  t.dtype = DType::f32;
  t.device = device;
  t.rank = 2;
  t.shape[0] = H;
  t.shape[1] = total_q;
  t.stride[0] = std::max<int64_t>(total_q, 1);
  t.stride[1] = 1;
  return t;
}

// Forward, then (spec.backward) backward from the forward's own o and lse,
// on fresh guarded buffers with poisoned outputs. Throws what the calls
// throw (gqattn::Error for a refused call).
inline RunResult run(const Batch& batch, const RunSpec& spec) {
  const Problem& p = batch.problem;
  const Device device = device_of(spec.backend);
  const DType t = spec.dtype;
  const std::size_t elem = dtype_size(t);
  const int64_t tq = batch.total_q(), tk = batch.total_k();
  const std::size_t q_bytes = std::size_t(tq * p.H * p.d) * elem;
  const std::size_t kv_bytes = std::size_t(tk * p.Hkv * p.d) * elem;
  const std::size_t lse_bytes = std::size_t(p.H * tq) * sizeof(float);

  GuardedBuffer q(device, q_bytes), k(device, kv_bytes), v(device, kv_bytes), o(device, q_bytes),
      lse(device, lse_bytes);
  q.upload(encode(t, batch.q));
  k.upload(encode(t, batch.k));
  v.upload(encode(t, batch.v));
  const oracle::VarlenLayout& layout = spec.given ? *spec.given : batch.layout;
  const Int32Vector cu_q(device, layout.cu_seqlens_q);
  const Int32Vector cu_k(device, layout.cu_seqlens_k);
  const Int32Vector used(device, layout.seqused_k);
  const VarlenOffsets offsets{cu_q.ref(), cu_k.ref(), used.ref()};
  Options options;
  options.backend = spec.backend;
  options.check_offsets = spec.check_offsets;

  const TensorRef Q = packed(q, t, device, tq, p.H, p.d);
  const TensorRef K = packed(k, t, device, tk, p.Hkv, p.d);
  const TensorRef V = packed(v, t, device, tk, p.Hkv, p.d);
  const TensorRef O = packed(o, t, device, tq, p.H, p.d);
  const TensorRef LSE = lse_ref(lse, device, p.H, tq);
  RunResult result;
  try {
    forward(p, offsets, Q, K, V, O, LSE, options);
  } catch (const gqattn::Error& e) {
    if (!spec.catch_errors) throw;
    result.forward_error = e.what();
  }
  if (device == Device::cuda) device_synchronize();

  result.dtype = t;
  result.o = read_output(o, q_bytes);
  result.lse = read_output(lse, lse_bytes);
  if (!spec.backward) return result;

  // Backward reads o and lse as forward left them (o rounded to the
  // dtype a 16-bit backend stores; the same o when o_rounding == t).
  std::vector<float> o_in = result.o_values();
  for (float& x : o_in) x = rounded(spec.o_rounding, x);
  GuardedBuffer o2(device, q_bytes), lse2(device, lse_bytes), dout(device, q_bytes),
      dq(device, q_bytes), dk(device, kv_bytes), dv(device, kv_bytes);
  o2.upload(encode(t, o_in));
  lse2.upload(result.lse.bytes);
  dout.upload(encode(t, batch.dout));
  try {
    backward(p, offsets, Q, K, V, packed(o2, t, device, tq, p.H, p.d),
             lse_ref(lse2, device, p.H, tq), packed(dout, t, device, tq, p.H, p.d),
             packed(dq, t, device, tq, p.H, p.d), packed(dk, t, device, tk, p.Hkv, p.d),
             packed(dv, t, device, tk, p.Hkv, p.d), options);
  } catch (const gqattn::Error& e) {
    if (!spec.catch_errors) throw;
    result.backward_error = e.what();
  }
  if (device == Device::cuda) device_synchronize();
  result.dq = read_output(dq, q_bytes);
  result.dk = read_output(dk, kv_bytes);
  result.dv = read_output(dv, kv_bytes);
  result.backward_ran = true;
  return result;
}

// The f32 CPU mirror on the same (rounded) inputs, its backward given o
// rounded to the batch's dtype: the yardstick of check.hpp's tolerances.
inline RunResult run_mirror(const Batch& batch) {
  RunSpec spec;
  spec.backend = Backend::Cpu;
  spec.dtype = DType::f32;
  spec.o_rounding = batch.dtype;
  return run(batch, spec);
}

// ---- measures -----------------------------------------------------------------

// The packed elements of one sequence in one output.
struct Span {
  std::vector<std::size_t> index;
};

// Rows [first, first + rows) of a [total, heads, d] tensor.
inline Span row_span(int64_t first, int64_t rows, int64_t heads, int64_t d) {
  Span s;
  for (int64_t e = first * heads * d; e < (first + rows) * heads * d; ++e)
    s.index.push_back(std::size_t(e));
  return s;
}

// Columns [first, first + rows) of lse [H, total_q].
inline Span lse_span(int64_t first, int64_t rows, int64_t H, int64_t total_q) {
  Span s;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = first; i < first + rows; ++i) s.index.push_back(std::size_t(h * total_q + i));
  return s;
}

struct SeqError {
  double error = 0.0;  // max |x - ref| / max |ref| (max |x - ref| when ref is all 0)
  std::string note;    // the first NaN or infinity mismatch
};

// gqattn::check's measure over one span: NaN, or an infinity where the
// reference has none (or the other sign), is an infinite error.
inline SeqError error_over(const Span& span, const std::vector<float>& x,
                           const std::vector<double>& ref) {
  SeqError m;
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t i : span.index) {
    const double r = ref[i], value = double(x[i]);
    if (std::isnan(value)) {
      m.error = std::numeric_limits<double>::infinity();
      m.note = "NaN at packed index " + std::to_string(i) + " (unwritten or invalid)";
      return m;
    }
    if (std::isinf(r) || std::isinf(value)) {
      if (r != value) {
        m.error = std::numeric_limits<double>::infinity();
        m.note = "packed index " + std::to_string(i) + ": " + std::to_string(value) +
                 ", expected " + std::to_string(r);
        return m;
      }
      continue;
    }
    max_ref = std::max(max_ref, std::fabs(r));
    max_diff = std::max(max_diff, std::fabs(value - r));
  }
  m.error = max_ref > 0.0 ? max_diff / max_ref : max_diff;
  return m;
}

inline std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Bytes [first, first + count) elements of `elem` bytes.
inline std::vector<unsigned char> byte_slice(const std::vector<unsigned char>& bytes,
                                             std::size_t elem, int64_t first, int64_t count) {
  return std::vector<unsigned char>(
      bytes.begin() + std::ptrdiff_t(std::size_t(first) * elem),
      bytes.begin() + std::ptrdiff_t(std::size_t(first + count) * elem));
}

}  // namespace gqattn::test::varlen

#endif  // GQATTN_WITH_CUDA
