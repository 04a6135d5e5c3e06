// The mask and score arguments of the fused kernels (cuda-flash, and
// cuda-hopper, which shares flash's mask policy and softmax), made from a
// validated Problem on the host. Checked through both backends' GPU tests.
#pragma once

#include <cfloat>
#include <cmath>

#include "cuda/flash/params.hpp"
#include "gqattn/types.hpp"

namespace gqattn::flash {

constexpr float kLog2e = 1.4426950408889634f;

// A window that covers every key (j >= i + off - window + 1 holds for all
// j >= 0 when window >= Tk) is no window.
inline MaskArgs mask_args(const Problem& p) {
  MaskArgs m;
  m.tq = int(p.Tq);
  m.tk = int(p.Tk);
  m.causal = p.causal;
  m.window = p.window >= p.Tk ? 0 : int(p.window);
  return m;
}

// Softcap folds the scale into tanh's argument and the cap into the
// exponent's multiplier; without it the scale goes into the multiplier.
inline ScoreArgs score_args(const Problem& p) {
  ScoreArgs s;
  s.scale = p.effective_scale();
  s.softcap = p.softcap > 0.0f;
  if (s.softcap) {
    s.pre = s.scale / p.softcap;
    if (!std::isfinite(s.pre)) s.pre = FLT_MAX;  // a denormal cap: tanh saturates, never 0 * inf
    s.mult = p.softcap * kLog2e;
  } else {
    s.mult = s.scale * kLog2e;
  }
  return s;
}

}  // namespace gqattn::flash
