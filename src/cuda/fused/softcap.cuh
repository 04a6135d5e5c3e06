// The logit soft-cap of the fused kernels, v = tanh(s pre) (ScoreArgs: the
// capped logit is cap * v), in three forms, each applied to a warp's
// accumulator tiles by one loop (for_each_score):
// - two special-function (MUFU) ops per score, ex2 and rcp (softcap_r):
//   softcap_tanh, apply_softcap, softcap_exponents. cuda-flash's forward and
//   backward, cuda-hopper's backward.
// - one MUFU op per score, the reciprocal on the FMA pipe (softcap_tanh_1mufu,
//   apply_softcap_1mufu): cuda-hopper's forward, where two MUFU ops plus the
//   softmax's ex2 bounded the softcapped kernel (the MUFU pipe gives 16
//   results per clock per SM).
// - none, on warp tiles whose logits all lie within 0.625 cap: the
//   polynomial of softcap_poly.hpp (softcap_poly_applies,
//   softcap_exponents_poly, softcap_tanh_poly).
// The *_exponents forms give v mult directly, for
// ScoreMode::softcap_without_row_max (score_mode.hpp). Checked against the
// f64 oracle by tests/gpu/test_flash_*.cpp and test_hopper_forward.cpp
// (softcap cases) and, the one-MUFU form on the host, against std::tanh over
// |y| <= 30 for several pre factors: absolute error <= 1.5e-7 (the two-MUFU
// form's: 1.9e-7; tanhf: 1.1e-7), exact 0 at 0, +-1 at +-inf, |result| <= 1.
//
// The one-MUFU form: with y = x * pre and e = 2^(-2 |y| log2 e) = exp(-2|y|)
// in [0, 1]:
//   tanh(|y|) = (1 - e) / (1 + e),  1 + e in [1, 2].
// 1 / (1 + e) starts from the minimax quadratic r0(e) = (98 - 80 e + 32 e^2)
// / 99, whose relative error is -T3(2e - 1) / 99 (at most 1/99), then two
// Newton steps r <- r + r (1 - (1 + e) r) square it twice (about 1e-8, below
// f32 rounding); the second is fused with the multiplication by 1 - e.
#pragma once

#include <cmath>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/softcap_poly.hpp"

namespace gqattn::fused {

constexpr float kSoftcapLog2e = 1.4426950408889634f;
constexpr float kSoftcapTwoLog2e = 2.0f * kSoftcapLog2e;
constexpr float kRecipDen = 99.0f;  // the quadratic's denominator (Chebyshev T3 at -3)
constexpr float kRecipC0 = 98.0f / kRecipDen;
constexpr float kRecipC1 = -80.0f / kRecipDen;
constexpr float kRecipC2 = 32.0f / kRecipDen;

// acc = f(acc) on every element of a warp's accumulator tiles: the one loop
// every form below runs.
template <int kMT, int kNT, typename F>
__device__ __forceinline__ void for_each_score(float (&acc)[kMT][kNT][4], F f) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = f(acc[mt][nt][e]);
}

// r = 1 / (e^(2y) + 1) for y = s pre, given k = 2 log2(e) pre: one ex2 and
// one rcp on the special function unit (rcp.approx: relative error 2^-23).
// Every two-MUFU form is built on it: tanh(y) = 1 - 2r, the forward's
// exponent mult tanh(y) = mult - 2 mult r, and the backward's 1 - tanh^2 =
// 4 r (1 - r). e^(2y) overflowing to +inf gives r = 0 (tanh +1), e^(2y) = 0
// gives r = 1 (tanh -1): exact at the extremes, no NaN.
__device__ __forceinline__ float softcap_r(float s, float k) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(fast_exp2(s * k) + 1.0f));
  return r;
}

// tanh(x) through softcap_r: absolute error about 1e-7 (the accuracy the
// logits need; tanh.approx's 2^-11 would not pass the bf16 tolerance with
// cap 30).
__device__ __forceinline__ float softcap_tanh(float x) {
  return fmaf(softcap_r(x, kSoftcapTwoLog2e), -2.0f, 1.0f);
}

// v = tanh(s * pre) on every element, two MUFU ops each.
template <int kMT, int kNT>
__device__ __forceinline__ void apply_softcap(float (&acc)[kMT][kNT][4], float pre) {
  for_each_score(acc, [pre](float x) { return softcap_tanh(x * pre); });
}

// The exponents v mult (v = tanh(s pre)) on every element, for
// ScoreMode::softcap_without_row_max (score_mode.hpp): mult folded into
// softcap_tanh's last step, mult tanh(y) = mult - 2 mult r: mul, ex2, add,
// rcp, fma.
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_exponents(float (&acc)[kMT][kNT][4], float pre,
                                                  float mult) {
  const float k = kSoftcapTwoLog2e * pre;
  const float minus_two_mult = -2.0f * mult;
  for_each_score(acc, [k, minus_two_mult, mult](float x) {
    return fmaf(softcap_r(x, k), minus_two_mult, mult);
  });
}

// The factor that maps a raw score x to the ex2 argument -2 |x pre| log2 e;
// pre = scale / cap > 0 (validated), so |x pre| = |x| pre.
__device__ __forceinline__ float softcap_ex2_factor(float pre) {
  return -2.0f * kSoftcapLog2e * pre;
}

// out * tanh(x * pre), given k = softcap_ex2_factor(pre). kScaled: out
// rides on the numerator, (1 - e) out, an FMA instead of the add (false:
// the plain tanh, out unused).
template <bool kScaled>
__device__ __forceinline__ float softcap_tanh_1mufu(float x, float k, float out = 1.0f) {
  const float e = fast_exp2(fabsf(x) * k);  // exp(-2|y|); 0 for |y| large or inf
  const float den = 1.0f + e;
  float r = fmaf(fmaf(e, kRecipC2, kRecipC1), e, kRecipC0);
  r = fmaf(r, fmaf(-den, r, 1.0f), r);
  const float q = (kScaled ? fmaf(-e, out, out) : 1.0f - e) * r;
  const float t = fmaf(q, fmaf(-den, r, 1.0f), q);  // out * tanh(|y|)
  return copysignf(t, x);
}

// acc = out * tanh(acc * pre) on every element. kScaled false: v = tanh,
// apply_softcap's contract; true with out = mult: the exponents v * mult of
// the no-offset softmax (score_mode.hpp), at the cost of the plain tanh.
template <bool kScaled = false, int kMT, int kNT>
__device__ __forceinline__ void apply_softcap_1mufu(float (&acc)[kMT][kNT][4], float pre,
                                                    float out = 1.0f) {
  const float k = softcap_ex2_factor(pre);
  for_each_score(acc, [k, out](float x) { return softcap_tanh_1mufu<kScaled>(x, k, out); });
}

// max |acc| over the elements [kFirst, kFirst + kCount) of the flattened
// tile, as a pairwise tree: depth log2(kCount), where a running maximum (or
// a chain of compare-and-accumulate predicates) is kCount deep and would sit
// on the critical path between the S GEMM and the exponentials. A NaN is
// dropped by fmaxf; it stays a NaN on either path of the caller.
template <int kFirst, int kCount, int kMT, int kNT>
__device__ __forceinline__ float abs_max_tree(const float (&acc)[kMT][kNT][4]) {
  if constexpr (kCount == 1) {
    return fabsf(acc[kFirst / (kNT * 4)][(kFirst / 4) % kNT][kFirst % 4]);
  } else {
    constexpr int kHalf = kCount / 2;
    return fmaxf(abs_max_tree<kFirst, kHalf>(acc),
                 abs_max_tree<kFirst + kHalf, kCount - kHalf>(acc));
  }
}

// True iff every raw score of the warp's tile lies within the polynomial's
// range, |s| <= bound = ScoreArgs::poly_bound; one vote, so the whole warp
// takes one path. All lanes must be active.
template <int kMT, int kNT>
__device__ __forceinline__ bool softcap_poly_applies(const float (&acc)[kMT][kNT][4], float bound) {
  return __all_sync(0xffffffffu, abs_max_tree<0, kMT * kNT * 4>(acc) <= bound);
}

// acc = mult tanh(acc pre) by the polynomial (softcap_poly.hpp), the
// no-offset softmax's exponents; coef = ScoreArgs::poly_exponent (mult
// folded in). Only where softcap_poly_applies: mul, mul, 4 fma, mul.
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_exponents_poly(float (&acc)[kMT][kNT][4], float pre,
                                                       const float (&coef)[kSoftcapPolyTerms]) {
  for_each_score(acc, [pre, &coef](float x) {
    const float y = x * pre;
    return y * softcap_poly_factor(y * y, coef);
  });
}

// acc = tanh(acc pre) by the polynomial, the running-maximum softcap mode's
// v. Only where softcap_poly_applies: mul, mul, 4 fma, mul.
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_tanh_poly(float (&acc)[kMT][kNT][4], float pre) {
  for_each_score(acc, [pre](float x) { return softcap_poly_tanh(x * pre); });
}

}  // namespace gqattn::fused
