// cuda-hopper: the forward's logit soft-cap, in two forms, one per softcap
// ScoreMode (flash/score_mode.hpp):
// - softcap (running row maximum): tanh with one special-function (MUFU) op
//   per element, below. cuda-flash's softcap_tanh (mask.cuh) costs two (ex2
//   and rcp, softcap_r); with the softmax's ex2 that made three MUFU
//   ops per score, and the MUFU pipe (16 results per clock per SM) bounded
//   that softcapped forward. Here the reciprocal is computed on the FMA pipe.
// - softcap_without_row_max: the exponents v mult directly, in the same
//   one-MUFU form (apply_softcap_1mufu<true>) or in cuda-flash's two-MUFU form
//   (softcap_exponents), per ForwardTile::kTwoMufuSoftcapExponents;
//   or, on warp tiles whose logits all lie within 0.625 cap, by the
//   polynomial of flash/softcap_poly.hpp with no MUFU op (kSoftcapPoly,
//   softcap_poly_applies and softcap_exponents_poly at the end of this file;
//   the running-maximum mode likewise, softcap_tanh_poly).
// Checked against the f64 oracle by tests/gpu/test_hopper_forward.cpp
// (softcap cases) and, on the host, against std::tanh over |y| <= 30 for
// several pre factors: absolute error <= 1.5e-7 (cuda-flash's: 1.9e-7;
// tanhf: 1.1e-7), exact 0 at 0, +-1 at +-inf, |result| <= 1.
//
// With y = x * pre and e = 2^(-2 |y| log2 e) = exp(-2|y|) in [0, 1]:
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
constexpr float kRecipDen = 99.0f;  // the quadratic's denominator (Chebyshev T3 at -3)
constexpr float kRecipC0 = 98.0f / kRecipDen;
constexpr float kRecipC1 = -80.0f / kRecipDen;
constexpr float kRecipC2 = 32.0f / kRecipDen;

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

// acc = out * tanh(acc * pre) on every element. kScaled false: v = tanh
// (ScoreArgs: the capped logit is cap * v), apply_softcap's contract;
// true with out = mult: the exponents v * mult of the no-offset softmax
// (flash/score_mode.hpp), at the cost of the plain tanh.
template <bool kScaled = false, int kMT, int kNT>
__device__ __forceinline__ void apply_softcap_1mufu(float (&acc)[kMT][kNT][4], float pre,
                                                    float out = 1.0f) {
  const float k = softcap_ex2_factor(pre);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[mt][nt][e] = softcap_tanh_1mufu<kScaled>(acc[mt][nt][e], k, out);
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

// acc = mult tanh(acc pre) by the polynomial (flash/softcap_poly.hpp), the
// no-offset softmax's exponents; coef = ScoreArgs::poly_exponent (mult
// folded in). Only where softcap_poly_applies: mul, mul, 4 fma, mul.
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_exponents_poly(float (&acc)[kMT][kNT][4], float pre,
                                                       const float (&coef)[kSoftcapPolyTerms]) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float y = acc[mt][nt][e] * pre;
        acc[mt][nt][e] = y * softcap_poly_factor(y * y, coef);
      }
}

// acc = tanh(acc pre) by the polynomial, the running-maximum softcap mode's
// v (ScoreArgs: the capped logit is cap * v). Only where
// softcap_poly_applies: mul, mul, 4 fma, mul.
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_tanh_poly(float (&acc)[kMT][kNT][4], float pre) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = softcap_poly_tanh(acc[mt][nt][e] * pre);
}

}  // namespace gqattn::fused
