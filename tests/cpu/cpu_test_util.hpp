// Shared helpers of the CPU tests: random inputs, host tensors in any dtype
// and layout (poisoned with NaN before each run), one call that runs forward
// then backward on the cpu backend through the public API, the f64 oracle on
// the same inputs, and error measures. Exercised by every test in tests/cpu/.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/oracle.hpp"

namespace gqattn::test {

using gqattn::make_problem;

// n values N(mean, 1), never zero-centred. With large_rows, about one row of
// d in eight is scaled by 8. Fixed by the seed.
inline std::vector<float> random_input(int64_t n, int64_t d, uint64_t seed, bool large_rows = true,
                                       float mean = 0.5f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(mean, 1.0f);
  std::uniform_int_distribution<int> eighth(0, 7);
  std::vector<float> x(n);
  for (int64_t row = 0; row * d < n; ++row) {
    const float gain = large_rows && eighth(rng) == 0 ? 8.0f : 1.0f;
    for (int64_t c = 0; c < d && row * d + c < n; ++c) x[row * d + c] = gain * normal(rng);
  }
  return x;
}

// Packed input values of one problem.
struct Inputs {
  Problem problem;
  std::vector<float> q, k, v, dout;
};

// Large rows go in q, v and do but not k: a large q row against a large k
// row gives logits of several hundred, where f32 rounding of the logit alone
// (ulp 3e-5 at 300) exceeds the f32 bound of 1e-5 that the tests hold every
// path to. One large factor still reaches logits of about 50 (peaked rows).
inline Inputs random_inputs(const Problem& p, uint64_t seed) {
  const int64_t nq = p.B * p.Tq * p.H * p.d, nk = p.B * p.Tk * p.Hkv * p.d;
  return Inputs{p, random_input(nq, p.d, seed), random_input(nk, p.d, seed + 1, false),
                random_input(nk, p.d, seed + 2), random_input(nq, p.d, seed + 3)};
}

// packed: default strides. strided: dimensions 1 and 2 swapped in memory
// ([B, heads, T, d] order, the usual transposed layout) with padding after
// every row, head and batch, so no stride equals its packed value.
enum class Layout { packed, strided };

// One tensor in host memory. The storage outside the view stays NaN, so a
// backend that writes past its view is caught.
class HostTensor {
 public:
  HostTensor(DType dtype, Layout layout, int rank, const int64_t (&shape)[4]) {
    ref_.dtype = dtype;
    ref_.device = Device::cpu;
    ref_.rank = rank;
    for (int a = 0; a < 4; ++a) ref_.shape[a] = a < rank ? shape[a] : 1;
    if (layout == Layout::packed || rank < 4) {
      const int64_t row_pad = layout == Layout::packed ? 0 : 2;
      int64_t stride = 1;
      for (int a = rank - 1; a >= 0; --a) {
        ref_.stride[a] = stride;
        stride *= ref_.shape[a] + (a == rank - 1 ? row_pad : 0);
      }
      if (layout == Layout::strided) ref_.stride[0] += 3;
    } else {
      ref_.stride[3] = 1;
      ref_.stride[1] = ref_.shape[3] + 3;
      ref_.stride[2] = ref_.shape[1] * ref_.stride[1] + 5;
      ref_.stride[0] = ref_.shape[2] * ref_.stride[2] + 7;
    }
    int64_t span = 1;
    for (int a = 0; a < rank; ++a) span += (ref_.shape[a] - 1) * ref_.stride[a];
    if (dtype == DType::f32) {
      f32_.assign(span, 0.0f);
      ref_.data = f32_.data();
    } else {
      half_.assign(span, 0);
      ref_.data = half_.data();
    }
    poison();
  }

  const TensorRef& ref() const { return ref_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int a = 0; a < ref_.rank; ++a) n *= ref_.shape[a];
    return n;
  }

  void fill(const std::vector<float>& packed) {
    for (int64_t n = 0; n < numel(); ++n)
      store_from_float(ref_.data, ref_.dtype, offset(n), packed[n]);
  }
  std::vector<float> read() const {
    std::vector<float> out(numel());
    for (int64_t n = 0; n < numel(); ++n) out[n] = load_as_float(ref_.data, ref_.dtype, offset(n));
    return out;
  }
  void poison() {
    const int64_t span = ref_.dtype == DType::f32 ? static_cast<int64_t>(f32_.size())
                                                  : static_cast<int64_t>(half_.size());
    for (int64_t n = 0; n < span; ++n)
      store_from_float(ref_.data, ref_.dtype, n, std::numeric_limits<float>::quiet_NaN());
  }
  // Every storage element outside the view is still NaN.
  bool padding_untouched() const {
    const int64_t span = ref_.dtype == DType::f32 ? static_cast<int64_t>(f32_.size())
                                                  : static_cast<int64_t>(half_.size());
    std::vector<bool> in_view(span, false);
    for (int64_t n = 0; n < numel(); ++n) in_view[offset(n)] = true;
    for (int64_t n = 0; n < span; ++n)
      if (!in_view[n] && !std::isnan(load_as_float(ref_.data, ref_.dtype, n))) return false;
    return true;
  }

 private:
  // Storage offset of the n-th element in packed order.
  int64_t offset(int64_t n) const {
    int64_t off = 0;
    for (int a = ref_.rank - 1; a >= 0; --a) {
      off += (n % ref_.shape[a]) * ref_.stride[a];
      n /= ref_.shape[a];
    }
    return off;
  }

  TensorRef ref_;
  std::vector<float> f32_;
  std::vector<uint16_t> half_;
};

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

inline bool has_nan(const std::vector<float>& x) {
  return std::any_of(x.begin(), x.end(), [](float value) { return std::isnan(value); });
}

// forward, then backward with forward's o and lse, on `backend` through
// the public API. Outputs start as NaN; a NaN left in an output (an element
// never written) or a write outside a view is a test failure.
inline Outputs run_on(Backend backend, const Inputs& in, DType dtype = DType::f32,
                      Layout layout = Layout::packed, int num_threads = 0) {
  const Problem& p = in.problem;
  const int64_t qs[4] = {p.B, p.Tq, p.H, p.d}, ks[4] = {p.B, p.Tk, p.Hkv, p.d};
  const int64_t ls[4] = {p.B, p.H, p.Tq, 1};
  HostTensor q(dtype, layout, 4, qs), k(dtype, layout, 4, ks), v(dtype, layout, 4, ks);
  HostTensor dout(dtype, layout, 4, qs), o(dtype, layout, 4, qs), dq(dtype, layout, 4, qs);
  HostTensor dk(dtype, layout, 4, ks), dv(dtype, layout, 4, ks);
  HostTensor lse(DType::f32, layout, 3, ls);
  q.fill(in.q);
  k.fill(in.k);
  v.fill(in.v);
  dout.fill(in.dout);
  Options options;
  options.backend = backend;
  options.num_threads = num_threads;
  forward(p, q.ref(), k.ref(), v.ref(), o.ref(), lse.ref(), options);
  backward(p, q.ref(), k.ref(), v.ref(), o.ref(), lse.ref(), dout.ref(), dq.ref(), dk.ref(),
           dv.ref(), options);
  Outputs out{o.read(), lse.read(), dq.read(), dk.read(), dv.read()};
  EXPECT_FALSE(has_nan(out.o) || has_nan(out.lse) || has_nan(out.dq) || has_nan(out.dk) ||
               has_nan(out.dv))
      << "an output element was not written (still NaN) or is NaN";
  for (const HostTensor* t : {&o, &lse, &dq, &dk, &dv})
    EXPECT_TRUE(t->padding_untouched()) << "a write landed outside an output's view";
  return out;
}

inline Outputs run_cpu(const Inputs& in, DType dtype = DType::f32, Layout layout = Layout::packed,
                       int num_threads = 0) {
  return run_on(Backend::Cpu, in, dtype, layout, num_threads);
}

inline std::vector<double> to_double(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

// The f64 oracle on the same (f32) inputs.
inline Reference run_oracle(const Inputs& in) {
  const auto q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
  oracle::ForwardResult fwd = oracle::forward(in.problem, q, k, v);
  oracle::Gradients g = oracle::backward(in.problem, q, k, v, to_double(in.dout));
  return Reference{std::move(fwd.o), std::move(fwd.lse), std::move(g.dq), std::move(g.dk),
                   std::move(g.dv)};
}

// max |x - ref| / max |ref| over the finite entries of ref; an infinite ref
// entry must be matched exactly, else the error is infinite. When ref is all
// zero the absolute error is returned.
template <typename T>
double max_rel_error(const std::vector<float>& x, const std::vector<T>& ref) {
  if (x.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double err = 0.0, scale = 0.0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    const double r = static_cast<double>(ref[n]);
    const double a = static_cast<double>(x[n]);
    if (std::isinf(r)) {
      if (a != r) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(a)) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(a - r));
    scale = std::max(scale, std::fabs(r));
  }
  return scale > 0.0 ? err / scale : err;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

inline void expect_same_bits(const Outputs& a, const Outputs& b) {
  EXPECT_TRUE(same_bits(a.o, b.o)) << "o";
  EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(same_bits(a.dq, b.dq)) << "dq";
  EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dk";
  EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dv";
}

}  // namespace gqattn::test
