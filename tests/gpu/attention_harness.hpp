// A harness for comparing a GPU backend with the CPU backend through the
// public API: random inputs rounded to the I/O dtype, device tensors in
// packed or non-packed layouts (padding poisoned and checked untouched),
// NaN-poisoned outputs, and error measures. Backend-agnostic: any CUDA
// backend's tests can use it. Header-only; used by tests/gpu/*.cpp.
#pragma once

#ifdef GQATTN_WITH_CUDA

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api/plan_override.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn::test {

// ---- layouts ----------------------------------------------------------------

enum class Layout {
  packed,       // default row-major strides
  padded,       // every stride but the last padded by a few elements
  heads_first,  // [B, T, H, d] stored as [B, H, T, d] (lse, already heads-first: padded)
};

using Shape4 = std::array<int64_t, 4>;

// Padding (elements) added to the head, position and batch strides by Layout::padded.
constexpr int64_t kPadInner = 3;
constexpr int64_t kPadMiddle = 5;
constexpr int64_t kPadOuter = 7;

inline void layout_strides(Layout layout, int rank, const Shape4& shape, Shape4& stride) {
  stride = {0, 0, 0, 0};
  stride[rank - 1] = 1;
  if (layout == Layout::heads_first && rank == 4) {
    stride[1] = shape[3];             // position
    stride[2] = shape[1] * shape[3];  // head
    stride[0] = shape[2] * stride[2];
    return;
  }
  const int64_t pad[3] = {kPadInner, kPadMiddle, kPadOuter};
  for (int r = rank - 2, n = 0; r >= 0; --r, ++n)
    stride[r] = shape[r + 1] * stride[r + 1] + (layout == Layout::packed ? 0 : pad[n]);
}

inline int64_t element_count(int rank, const Shape4& shape) {
  int64_t n = 1;
  for (int r = 0; r < rank; ++r) n *= shape[r];
  return n;
}

// Calls f(packed_index, element_offset) for every element, in packed order.
template <class F>
void for_each_element(int rank, const Shape4& shape, const Shape4& stride, F f) {
  const int64_t total = element_count(rank, shape);
  Shape4 index = {0, 0, 0, 0};
  for (int64_t n = 0; n < total; ++n) {
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += index[r] * stride[r];
    f(n, offset);
    for (int r = rank - 1; r >= 0; --r) {
      if (++index[r] < shape[r]) break;
      index[r] = 0;
    }
  }
}

// ---- tensors ----------------------------------------------------------------

// A device tensor whose buffer covers every element its strides address;
// elements outside the view (padding) hold the poison pattern.
struct DeviceTensor {
  TensorRef ref;
  DeviceBuffer buffer;
  int64_t span = 0;  // elements addressed, padding included
};

inline DeviceTensor device_tensor(DType dtype, Layout layout, int rank, const Shape4& shape) {
  DeviceTensor t;
  Shape4 stride;
  layout_strides(layout, rank, shape, stride);
  t.span = 1;
  for (int r = 0; r < rank; ++r) t.span += (shape[r] - 1) * stride[r];
  t.buffer = DeviceBuffer(std::size_t(t.span) * dtype_size(dtype));
  t.buffer.poison();
  t.ref.data = t.buffer.get();
  t.ref.dtype = dtype;
  t.ref.device = Device::cuda;
  t.ref.rank = rank;
  for (int r = 0; r < 4; ++r) {
    t.ref.shape[r] = shape[r];
    t.ref.stride[r] = stride[r];
  }
  return t;
}

inline Shape4 shape_of(const TensorRef& t) {
  return {t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
}
inline Shape4 stride_of(const TensorRef& t) {
  return {t.stride[0], t.stride[1], t.stride[2], t.stride[3]};
}

// Writes packed `values` into the view; padding keeps the poison pattern.
inline void upload_values(DeviceTensor& t, const std::vector<float>& values) {
  std::vector<unsigned char> image(std::size_t(t.span) * dtype_size(t.ref.dtype),
                                   static_cast<unsigned char>(kPoisonByte));
  for_each_element(t.ref.rank, shape_of(t.ref), stride_of(t.ref), [&](int64_t n, int64_t off) {
    store_from_float(image.data(), t.ref.dtype, std::size_t(off), values[std::size_t(n)]);
  });
  t.buffer.upload(image.data(), image.size());
}

// The view's values, packed. padding_intact becomes false if any element
// outside the view lost the poison pattern (an out-of-view write).
inline std::vector<float> download_values(const DeviceTensor& t, bool& padding_intact) {
  const std::vector<unsigned char> image = t.buffer.download<unsigned char>();
  const std::size_t elem = dtype_size(t.ref.dtype);
  std::vector<float> out(std::size_t(element_count(t.ref.rank, shape_of(t.ref))));
  std::vector<bool> in_view(std::size_t(t.span), false);
  for_each_element(t.ref.rank, shape_of(t.ref), stride_of(t.ref), [&](int64_t n, int64_t off) {
    out[std::size_t(n)] = load_as_float(image.data(), t.ref.dtype, std::size_t(off));
    in_view[std::size_t(off)] = true;
  });
  for (std::size_t e = 0; e < in_view.size(); ++e) {
    if (in_view[e]) continue;
    for (std::size_t byte = e * elem; byte < (e + 1) * elem; ++byte)
      if (image[byte] != static_cast<unsigned char>(kPoisonByte)) padding_intact = false;
  }
  return out;
}

// A packed host tensor for the CPU backend.
struct HostTensor {
  TensorRef ref;
  std::vector<unsigned char> bytes;
};

inline HostTensor host_tensor(DType dtype, int rank, const Shape4& shape,
                              const std::vector<float>* values) {
  HostTensor t;
  const int64_t n = element_count(rank, shape);
  t.bytes.assign(std::size_t(n) * dtype_size(dtype), static_cast<unsigned char>(kPoisonByte));
  if (values != nullptr)
    for (int64_t e = 0; e < n; ++e)
      store_from_float(t.bytes.data(), dtype, std::size_t(e), (*values)[std::size_t(e)]);
  t.ref = rank == 4 ? contiguous(t.bytes.data(), dtype, Device::cpu, shape[0], shape[1], shape[2],
                                 shape[3])
                    : contiguous(t.bytes.data(), dtype, Device::cpu, shape[0], shape[1], shape[2]);
  return t;
}

inline std::vector<float> host_values(const HostTensor& t) {
  std::vector<float> out(t.bytes.size() / dtype_size(t.ref.dtype));
  for (std::size_t e = 0; e < out.size(); ++e)
    out[e] = load_as_float(t.bytes.data(), t.ref.dtype, e);
  return out;
}

// ---- inputs and runs --------------------------------------------------------

inline Shape4 q_shape(const Problem& p) { return {p.B, p.Tq, p.H, p.d}; }
inline Shape4 kv_shape(const Problem& p) { return {p.B, p.Tk, p.Hkv, p.d}; }
inline Shape4 lse_shape(const Problem& p) { return {p.B, p.H, p.Tq, 0}; }

// Packed inputs, each value representable in `dtype`.
struct Inputs {
  Problem problem;
  DType dtype = DType::f32;
  std::vector<float> q, k, v, dout;
};

// Input distribution (docs/semantics.md, correctness): normal with a non-zero
// mean, and every kLargeRowEvery-th row of q scaled up so some softmax rows are
// near one-hot.
constexpr float kInputMean = 0.25f;
constexpr int64_t kLargeRowEvery = 7;
constexpr float kLargeRowFactor = 8.0f;

inline float round_to(DType dtype, float x) {
  unsigned char bytes[sizeof(float)];
  store_from_float(bytes, dtype, 0, x);
  return load_as_float(bytes, dtype, 0);
}

// `magnitude` scales q and k (large values give large logits).
inline Inputs random_inputs(const Problem& p, DType dtype, uint64_t seed, float magnitude = 1.0f) {
  Inputs in;
  in.problem = p;
  in.dtype = dtype;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(kInputMean, 1.0f);
  auto fill = [&](std::vector<float>& x, int64_t n, float scale, bool large_rows) {
    x.resize(std::size_t(n));
    for (int64_t e = 0; e < n; ++e) {
      const bool large = large_rows && (e / p.d) % kLargeRowEvery == 0;
      x[std::size_t(e)] = round_to(dtype, normal(rng) * scale * (large ? kLargeRowFactor : 1.0f));
    }
  };
  fill(in.q, element_count(4, q_shape(p)), magnitude, true);
  fill(in.k, element_count(4, kv_shape(p)), magnitude, false);
  fill(in.v, element_count(4, kv_shape(p)), 1.0f, false);
  fill(in.dout, element_count(4, q_shape(p)), 1.0f, false);
  return in;
}

struct ForwardResult {
  std::vector<float> o, lse;  // packed
  bool padding_intact = true;
};
struct BackwardResult {
  std::vector<float> dq, dk, dv;  // packed
  bool padding_intact = true;
};

inline Options options_for(Backend backend, void* stream = nullptr) {
  Options options;
  options.backend = backend;
  options.stream = stream;
  return options;
}

inline ForwardResult cpu_forward(const Inputs& in) {
  const Problem& p = in.problem;
  HostTensor q = host_tensor(in.dtype, 4, q_shape(p), &in.q);
  HostTensor k = host_tensor(in.dtype, 4, kv_shape(p), &in.k);
  HostTensor v = host_tensor(in.dtype, 4, kv_shape(p), &in.v);
  HostTensor o = host_tensor(in.dtype, 4, q_shape(p), nullptr);
  HostTensor lse = host_tensor(DType::f32, 3, lse_shape(p), nullptr);
  forward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, options_for(Backend::Cpu));
  return {host_values(o), host_values(lse), true};
}

// Backward from the given forward result (the same o and lse for every
// backend compared, so gradients are compared alone).
inline BackwardResult cpu_backward(const Inputs& in, const ForwardResult& fwd) {
  const Problem& p = in.problem;
  HostTensor q = host_tensor(in.dtype, 4, q_shape(p), &in.q);
  HostTensor k = host_tensor(in.dtype, 4, kv_shape(p), &in.k);
  HostTensor v = host_tensor(in.dtype, 4, kv_shape(p), &in.v);
  HostTensor o = host_tensor(in.dtype, 4, q_shape(p), &fwd.o);
  HostTensor lse = host_tensor(DType::f32, 3, lse_shape(p), &fwd.lse);
  HostTensor dout = host_tensor(in.dtype, 4, q_shape(p), &in.dout);
  HostTensor dq = host_tensor(in.dtype, 4, q_shape(p), nullptr);
  HostTensor dk = host_tensor(in.dtype, 4, kv_shape(p), nullptr);
  HostTensor dv = host_tensor(in.dtype, 4, kv_shape(p), nullptr);
  backward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, dq.ref, dk.ref, dv.ref,
           options_for(Backend::Cpu));
  return {host_values(dq), host_values(dk), host_values(dv), true};
}

inline DeviceTensor device_input(DType dtype, Layout layout, const Shape4& shape,
                                 const std::vector<float>& values) {
  DeviceTensor t = device_tensor(dtype, layout, 4, shape);
  upload_values(t, values);
  return t;
}

// lse is [B, H, Tq] with Tq contiguous in every layout, so heads_first pads it.
inline Layout lse_layout(Layout layout) {
  return layout == Layout::heads_first ? Layout::padded : layout;
}

// Runs `backend` on device tensors of `layout` with NaN-poisoned outputs.
// write_lse false passes lse with data == nullptr (not written).
inline ForwardResult gpu_forward(Backend backend, const Inputs& in, Layout layout = Layout::packed,
                                 void* stream = nullptr, bool write_lse = true) {
  const Problem& p = in.problem;
  DeviceTensor q = device_input(in.dtype, layout, q_shape(p), in.q);
  DeviceTensor k = device_input(in.dtype, layout, kv_shape(p), in.k);
  DeviceTensor v = device_input(in.dtype, layout, kv_shape(p), in.v);
  DeviceTensor o = device_tensor(in.dtype, layout, 4, q_shape(p));
  DeviceTensor lse = device_tensor(DType::f32, lse_layout(layout), 3, lse_shape(p));
  TensorRef lse_ref = lse.ref;
  if (!write_lse) lse_ref.data = nullptr;
  // Uploads and poison ran on the legacy stream, which a non-blocking
  // caller stream does not wait for.
  device_synchronize();
  forward(p, q.ref, k.ref, v.ref, o.ref, lse_ref, options_for(backend, stream));
  device_synchronize();
  ForwardResult out;
  out.o = download_values(o, out.padding_intact);
  out.lse = download_values(lse, out.padding_intact);
  return out;
}

inline BackwardResult gpu_backward(Backend backend, const Inputs& in, const ForwardResult& fwd,
                                   Layout layout = Layout::packed, void* stream = nullptr) {
  const Problem& p = in.problem;
  DeviceTensor q = device_input(in.dtype, layout, q_shape(p), in.q);
  DeviceTensor k = device_input(in.dtype, layout, kv_shape(p), in.k);
  DeviceTensor v = device_input(in.dtype, layout, kv_shape(p), in.v);
  DeviceTensor o = device_input(in.dtype, layout, q_shape(p), fwd.o);
  DeviceTensor lse = device_tensor(DType::f32, lse_layout(layout), 3, lse_shape(p));
  upload_values(lse, fwd.lse);
  DeviceTensor dout = device_input(in.dtype, layout, q_shape(p), in.dout);
  DeviceTensor dq = device_tensor(in.dtype, layout, 4, q_shape(p));
  DeviceTensor dk = device_tensor(in.dtype, layout, 4, kv_shape(p));
  DeviceTensor dv = device_tensor(in.dtype, layout, 4, kv_shape(p));
  device_synchronize();  // as in gpu_forward
  backward(p, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, dq.ref, dk.ref, dv.ref,
           options_for(backend, stream));
  device_synchronize();
  BackwardResult out;
  out.dq = download_values(dq, out.padding_intact);
  out.dk = download_values(dk, out.padding_intact);
  out.dv = download_values(dv, out.padding_intact);
  return out;
}

// ---- measures ---------------------------------------------------------------

struct Comparison {
  double error = 0.0;   // max |got - ref| / max |ref| over finite ref; inf on a mismatch below
  bool bitwise = true;  // every element has the same bits
  std::string note;     // first problem seen: NaN (unwritten), -inf mismatch, size
};

inline Comparison compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Comparison c;
  if (got.size() != ref.size()) {
    c.error = INFINITY;
    c.bitwise = false;
    c.note = "size " + std::to_string(got.size()) + " != " + std::to_string(ref.size());
    return c;
  }
  double max_diff = 0.0, max_ref = 0.0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (std::memcmp(&got[e], &ref[e], sizeof(float)) != 0) c.bitwise = false;
    if (std::isnan(got[e]) || std::isnan(ref[e]) || std::isinf(got[e]) != std::isinf(ref[e]) ||
        (std::isinf(ref[e]) && got[e] != ref[e])) {
      if (c.note.empty())
        c.note = "element " + std::to_string(e) + ": got " + std::to_string(got[e]) + ", want " +
                 std::to_string(ref[e]);
      c.error = INFINITY;
      continue;
    }
    if (std::isinf(ref[e])) continue;
    max_diff = std::fmax(max_diff, std::fabs(double(got[e]) - double(ref[e])));
    max_ref = std::fmax(max_ref, std::fabs(double(ref[e])));
  }
  if (c.error == 0.0)
    c.error = max_ref > 0.0 ? max_diff / max_ref : (max_diff == 0.0 ? 0.0 : INFINITY);
  return c;
}

// Position of x among the values of a 16-bit dtype, in order, so that
// neighbouring representable values differ by 1.
inline int64_t ordinal16(DType dtype, float x) {
  const uint16_t bits = dtype == DType::bf16 ? float_to_bf16(x) : float_to_f16(x);
  const int64_t magnitude = bits & 0x7fff;
  return (bits & 0x8000) ? -magnitude : magnitude;
}

// Elements of a bf16/f16 result farther from `ref` than one representable
// step of the dtype and than `floor` (absolute). A single rounding of two
// f32 values an ulp apart may land on neighbouring 16-bit values, no further.
inline int64_t beyond_one_step(DType dtype, const std::vector<float>& got,
                               const std::vector<float>& ref, double floor) {
  int64_t count = 0;
  for (std::size_t e = 0; e < got.size() && e < ref.size(); ++e) {
    if (std::isnan(got[e]) || std::isnan(ref[e])) {
      ++count;
      continue;
    }
    if (std::fabs(double(got[e]) - double(ref[e])) <= floor) continue;
    const int64_t steps = ordinal16(dtype, got[e]) - ordinal16(dtype, ref[e]);
    if (steps > 1 || steps < -1) ++count;
  }
  return count + int64_t(got.size() != ref.size());
}

inline double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (float e : x)
    if (std::isfinite(e)) m = std::fmax(m, std::fabs(double(e)));
  return m;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- forced plans ------------------------------------------------------------

// The Error of a backward on `backend` (bf16, packed layouts) with the plan
// `force` forced through the plan override (api/plan_override.hpp) and
// Options::deterministic = `deterministic`, which must throw; dq, dk and dv
// (poisoned before) must still be all poison afterwards.
inline Error backward_forced_error(const Problem& p, Backend backend,
                                   const detail::PlanOverride& force, bool deterministic) {
  const detail::ScopedPlanOverride scope(force);
  constexpr std::size_t kElem = 2;
  const std::size_t q_bytes = std::size_t(p.B * p.Tq * p.H * p.d) * kElem;
  const std::size_t kv_bytes = std::size_t(p.B * p.Tk * p.Hkv * p.d) * kElem;
  DeviceBuffer q(q_bytes), k(kv_bytes), v(kv_bytes), o(q_bytes), dout(q_bytes), dq(q_bytes),
      dk(kv_bytes), dv(kv_bytes), lse(std::size_t(p.B * p.H * p.Tq) * sizeof(float));
  for (DeviceBuffer* b : {&q, &k, &v, &o, &dout, &dq, &dk, &dv, &lse}) b->poison();
  auto ref = [&](const DeviceBuffer& b, int64_t T, int64_t heads) {
    return contiguous(b.get(), DType::bf16, Device::cuda, p.B, T, heads, p.d);
  };
  const TensorRef lse_ref = contiguous(lse.get(), DType::f32, Device::cuda, p.B, p.H, p.Tq);
  Options options;
  options.backend = backend;
  options.deterministic = deterministic;
  Error error("", "");
  bool thrown = false;
  try {
    gqattn::backward(p, ref(q, p.Tq, p.H), ref(k, p.Tk, p.Hkv), ref(v, p.Tk, p.Hkv),
                     ref(o, p.Tq, p.H), lse_ref, ref(dout, p.Tq, p.H), ref(dq, p.Tq, p.H),
                     ref(dk, p.Tk, p.Hkv), ref(dv, p.Tk, p.Hkv), options);
  } catch (const Error& e) {
    error = e;
    thrown = true;
  }
  EXPECT_TRUE(thrown) << "forced " << detail::to_string(force) << " deterministic=" << deterministic
                      << " was accepted";
  for (const DeviceBuffer* b : {&dq, &dk, &dv})
    for (uint16_t bits : b->download<uint16_t>()) EXPECT_EQ(bits, 0xFFFFu) << "written";
  return error;
}

}  // namespace gqattn::test

#endif  // GQATTN_WITH_CUDA
