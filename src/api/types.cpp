// Small helpers of the public types (types.hpp, dtype.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "gqattn/dtype.hpp"
#include "gqattn/types.hpp"

namespace gqattn {

float Problem::effective_scale() const {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(d));
}

int64_t Problem::query_start() const { return q_start ? *q_start : Tk - Tq; }

// Validation bounds |q_start| and Tq by 2^53, so query_start() + Tq cannot overflow.
int64_t Problem::effective_window() const {
  return window <= 0 || window >= query_start() + Tq ? 0 : window;
}

namespace {
// Wide enough for Tq * Tk with both up to 2^53 (what validation allows).
__extension__ typedef __int128 Wide;
// sum_{x=1..n} min(x, cap), for n >= 0 and cap >= 1.
Wide sum_min(Wide n, Wide cap) {
  if (n <= cap) return n * (n + 1) / 2;
  return cap * (cap + 1) / 2 + (n - cap) * cap;
}
// sum_{x=a..b} clamp(x, 0, cap): terms x <= 0 count 0 (a, b may be negative).
Wide sum_clamped(Wide a, Wide b, Wide cap) {
  if (b < 1) return 0;
  return sum_min(b, cap) - sum_min(a - 1 > 0 ? a - 1 : 0, cap);
}
}  // namespace

// With x = q_start + i + 1 (one past query i's position) and
// C(y) = clamp(y, 0, Tk), row i keeps C(x) keys under causal alone (keys
// 0 .. x - 1), and the window drops the C(x - w) keys below x - w; without
// causal it keeps Tk - C(x - w) (keys x - w .. Tk - 1) or, with no window,
// all Tk. sum_clamped sums C over a run of x. tests/cpu/test_problem.cpp
// checks it against the row-by-row count. The sums run in 128 bits (Tq * Tk
// reaches 2^106 for sizes validation accepts) and the result saturates at
// INT64_MAX.
int64_t Problem::kept_pairs() const {
  const Wide first = Wide(query_start()) + 1, last = first + Tq - 1;
  const Wide w = effective_window();
  const Wide dropped_by_window = w > 0 ? sum_clamped(first - w, last - w, Tk) : 0;
  Wide pairs;
  if (causal)
    pairs = sum_clamped(first, last, Tk) - dropped_by_window;
  else
    pairs = Wide(Tq) * Tk - dropped_by_window;
  const Wide most = std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pairs < most ? pairs : most);
}

namespace {

// A tensor of the given dims with row-major strides (the last contiguous).
TensorRef row_major(void* data, DType dtype, Device device, std::initializer_list<int64_t> dims) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = int(dims.size());
  int r = 0;
  for (const int64_t n : dims) t.shape[r++] = n;
  int64_t stride = 1;
  for (r = t.rank - 1; r >= 0; --r) {
    t.stride[r] = stride;
    stride *= t.shape[r];
  }
  return t;
}

}  // namespace

TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1) {
  return row_major(data, dtype, device, {d0, d1});
}

TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2) {
  return row_major(data, dtype, device, {d0, d1, d2});
}

TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2,
                     int64_t d3) {
  return row_major(data, dtype, device, {d0, d1, d2, d3});
}

std::size_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

float bf16_to_float(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if (std::isnan(value)) return uint16_t((u >> 16) | 0x40);  // stay a (quiet) NaN
  const uint32_t round = 0x7fff + ((u >> 16) & 1);           // to nearest, ties to even
  return uint16_t((u + round) >> 16);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(float(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(float(mantissa | 0x400), int(exponent) - 25);
  }
  uint32_t u;
  std::memcpy(&u, &magnitude, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(value);
  if (std::isnan(value)) return uint16_t(sign | 0x7e00);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00);       // rounds to inf
  if (a < 6.103515625e-05f) {                              // subnormal range: multiples of 2^-24
    const float scaled = std::nearbyint(a * 16777216.0f);  // default rounding: ties to even
    return uint16_t(sign | uint16_t(scaled));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 11 significant bits: mantissa = m * 2^11, rounded to nearest even.
  float mant = std::nearbyint(m * 2048.0f);
  if (mant >= 2048.0f) {
    mant /= 2.0f;
    ++e;
  }
  const int exponent = e - 1 + 15;
  if (exponent >= 31) return uint16_t(sign | 0x7c00);
  return uint16_t(sign | (uint16_t(exponent) << 10) | (uint16_t(mant) & 0x3ff));
}

float load_as_float(const void* data, DType dtype, std::size_t index) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[index];
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(data)[index]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(data)[index]);
  }
  return 0.0f;
}

void store_from_float(void* data, DType dtype, std::size_t index, float value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[index] = value; break;
    case DType::bf16: static_cast<uint16_t*>(data)[index] = float_to_bf16(value); break;
    case DType::f16: static_cast<uint16_t*>(data)[index] = float_to_f16(value); break;
  }
}

Problem make_problem(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t d,
                     bool causal, int64_t window, float softcap) {
  Problem p;
  p.B = B;
  p.Tq = Tq;
  p.Tk = Tk;
  p.H = H;
  p.Hkv = Hkv;
  p.d = d;
  p.causal = causal;
  p.window = window;
  p.softcap = softcap;
  return p;
}

}  // namespace gqattn
