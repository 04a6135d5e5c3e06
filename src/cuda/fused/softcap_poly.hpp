// tanh of small arguments on the FMA pipe, for the softcapped kernels whose
// special-function (MUFU) pipe, not their GEMMs, bounds them. Every other
// softcap form spends one or two MUFU ops per score on tanh (softcap.cuh:
// softcap_r, ex2 + rcp; softcap_tanh_1mufu, ex2) on top of the softmax's
// ex2. For |y| <= kSoftcapPolyMaxY an odd polynomial needs none:
//   tanh(y) = y p(y^2),  p a degree-4 minimax fit of tanh(y) / y.
// Where it applies: the kernels test the raw scores of a warp's tile against
// ScoreArgs::poly_bound (= kSoftcapPolyMaxY / pre) and take this path only
// if every lane's scores pass (one warp vote per tile), else their MUFU form.
// So the result never depends on the path beyond rounding, and logits up to
// 0.625 cap (18.75 at cap 30, 31.25 at cap 50; the softcap's linear range,
// where most logits of a trained model lie) skip the MUFU for tanh.
// Host and device code: tests/cpu/test_softcap_poly.cpp checks it against
// std::tanh without a GPU; the kernels are checked against the f64 oracle
// on the H200 (tests/gpu/test_hopper_forward.cpp, softcap cases: small
// logits take this path, large ones the MUFU form, "mixed" both in one tile).
//
// Accuracy (f32 Horner with fused multiply-adds): absolute error below
// 1.2e-7 on [-0.625, 0.625], as good as the MUFU forms (1.5e-7 and 1.9e-7);
// exact 0 at 0 and odd in y.
#pragma once

#include <cmath>

#include "cuda/fused/host_device.hpp"

namespace gqattn::fused {

// The largest |y| = |q.k scale / cap| the polynomial serves.
constexpr float kSoftcapPolyMaxY = 0.625f;

// Minimax (relative error 1.1e-7) coefficients of tanh(y) / y in z = y^2 on
// |y| <= kSoftcapPolyMaxY: c0 + c1 z + c2 z^2 + c3 z^3 + c4 z^4. Scalars,
// so device code reads them as immediates (a namespace-scope array would
// have to live in device memory).
constexpr int kSoftcapPolyTerms = 5;
constexpr float kSoftcapPolyC0 = 9.999998808e-01f;
constexpr float kSoftcapPolyC1 = -3.333195448e-01f;
constexpr float kSoftcapPolyC2 = 1.330452412e-01f;
constexpr float kSoftcapPolyC3 = -5.182177946e-02f;
constexpr float kSoftcapPolyC4 = 1.505082007e-02f;
// The same, for the host (ScoreArgs::poly_exponent, tests).
constexpr float kSoftcapPolyCoef[kSoftcapPolyTerms] = {
    kSoftcapPolyC0, kSoftcapPolyC1, kSoftcapPolyC2, kSoftcapPolyC3, kSoftcapPolyC4};

// c0 + c1 z + ... + c4 z^4 by Horner: four fused multiply-adds.
GQATTN_HD float softcap_poly_horner(float z, float c0, float c1, float c2, float c3, float c4) {
  return fmaf(fmaf(fmaf(fmaf(c4, z, c3), z, c2), z, c1), z, c0);
}

// out * p(z), with the coefficients pre-multiplied by out (scaled_coef[i]
// = out * kSoftcapPolyCoef[i], ScoreArgs::poly_exponent for the exponent
// mult tanh(y)): y times it is out * tanh(y).
GQATTN_HD float softcap_poly_factor(float z, const float (&scaled_coef)[kSoftcapPolyTerms]) {
  return softcap_poly_horner(z, scaled_coef[0], scaled_coef[1], scaled_coef[2], scaled_coef[3],
                             scaled_coef[4]);
}

// tanh(y) for |y| <= kSoftcapPolyMaxY (beyond it the error grows; callers
// test the bound first).
GQATTN_HD float softcap_poly_tanh(float y) {
  return y * softcap_poly_horner(y * y, kSoftcapPolyC0, kSoftcapPolyC1, kSoftcapPolyC2,
                                 kSoftcapPolyC3, kSoftcapPolyC4);
}

// The backward's r = 1 / (e^(2y) + 1) = (1 - tanh(y)) / 2 = 1/2 + y q(z)
// with q = -p / 2 (scaling by -1/2 is exact), for |y| <= kSoftcapPolyMaxY:
// mul, 4 fma, fma.
GQATTN_HD float softcap_poly_r(float y) {
  return fmaf(
      y,
      softcap_poly_horner(y * y, -0.5f * kSoftcapPolyC0, -0.5f * kSoftcapPolyC1,
                          -0.5f * kSoftcapPolyC2, -0.5f * kSoftcapPolyC3, -0.5f * kSoftcapPolyC4),
      0.5f);
}

}  // namespace gqattn::fused
