// 2^x without the special function unit: for softmax loops whose
// exponentials, not their GEMMs, bound them. The MUFU pipe gives 16 results
// per clock per SM against 128 FP32 FMAs, and under softcap two of its ops
// per score already go to tanh (softcap_r), so a share of P's
// exponentials computed here (FlashAttention-4's device) moves work from the
// saturated pipe to idle ones. Host and device code, so that
// tests/cpu/test_exp2_fma.cpp checks it against std::exp2 without a GPU; the
// kernels that use it are checked against the f64 oracle on the H200.
//
// Method: j = x rounded to the nearest integer (adding 1.5 * 2^23 leaves
// round(x) in the low mantissa bits, IEEE round to nearest), f = x - j in
// [-0.5, 0.5], 2^f by a degree-3 polynomial, times 2^j built in the
// exponent field: (bits of x + 1.5 * 2^23) * 2^23 is j << 23 modulo 2^32,
// whatever the high bits, so one integer multiply-add gives (j + 127) << 23.
//
// Invariants:
// - x <= -127 (among them -inf, a masked score) gives exactly +0, as
//   ex2.approx.ftz does: x is clamped to -127, where 2^j has biased
//   exponent 0 and mantissa 0, i.e. is +0, and p * 0 = 0. For x in
//   (-127, -126) the result is 0 or a subnormal below 2^-126 (a flushed 0
//   under ex2.approx.ftz; either is below every 16-bit number).
// - Relative error below 7.5e-5 (2^-13.7) where the result is a normal
//   number; the 16-bit P a GEMM takes is rounded at 2^-9 (bf16) or 2^-12
//   (f16) anyway.
// - x must be below 127.5 (callers pass exponents <= 0, or at most
//   kMaxUnshiftedExponent) and not NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/fused/host_device.hpp"

namespace gqattn::fused {

// Minimax (relative error) coefficients of 2^f on [-0.5, 0.5], c0 + c1 f +
// c2 f^2 + c3 f^3.
constexpr float kExp2FmaC0 = 0.99992806f;
constexpr float kExp2FmaC1 = 0.69326103f;
constexpr float kExp2FmaC2 = 0.24261114f;
constexpr float kExp2FmaC3 = 0.05517153f;
// 1.5 * 2^23: adding it to |x| < 2^22 rounds x to an integer in place.
constexpr float kRoundToIntegerShift = 12582912.0f;
constexpr float kExp2FmaMinExponent = -127.0f;
constexpr uint32_t kExponentOne = 1u << 23;           // one in the exponent field
constexpr uint32_t kBiasedExponentZero = 127u << 23;  // the bits of 1.0f

GQATTN_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

GQATTN_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

GQATTN_HD float exp2_fma(float x) {
  x = fmaxf(x, kExp2FmaMinExponent);  // also maps -inf
  const float shifted = x + kRoundToIntegerShift;
  const float j = shifted - kRoundToIntegerShift;
  const float f = x - j;
  float p = fmaf(kExp2FmaC3, f, kExp2FmaC2);
  p = fmaf(p, f, kExp2FmaC1);
  p = fmaf(p, f, kExp2FmaC0);
  const float two_to_j = bits_float(float_bits(shifted) * kExponentOne + kBiasedExponentZero);
  return p * two_to_j;
}

}  // namespace gqattn::fused
