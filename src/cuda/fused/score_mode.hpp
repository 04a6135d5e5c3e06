// The fused forwards' (cuda-flash's and cuda-hopper's) choice of how a tile
// of scores becomes P, made per problem on the host (each backend's
// launch_forward.cuh) and a template parameter of the kernels. Plain C++ so
// the launchers can decide; checked on the CPU by tests/cpu/test_score_mode.cpp
// (which problems take which mode) and on the GPU by
// tests/gpu/test_flash_correctness.cpp and test_hopper_forward.cpp (every
// mode against the f64 oracle).
//
// The online softmax subtracts a running row maximum m from every exponent
// so that P = 2^(v mult - m mult) <= 1 cannot overflow; it costs, per score,
// a max and (per row) a quad reduction, and per tile the rescale of O by
// 2^(m_old mult - m_new mult), and each exponent waits for the row's max.
// Under softcap the exponent v mult (v = tanh, ScoreArgs) is bounded
// a priori: |v mult| <= mult = cap log2 e. So where 2^mult is far inside
// the range of f32 and of P's element type, P = 2^(v mult) needs no offset
// at all: no max, no rescale, exponents independent of each other. The
// results are the same sums of the same P up to the factor 2^(m mult) (bf16
// rounds relative to magnitude), except that o is normalised by the sums of
// the 16-bit P (below); lse = log(sum of the f32 P) (the row maximum is 0).
//
// Limits of the no-offset mode (kMaxUnshiftedExponent = 76, cap <= 52.68,
// so Gemma 2's cap 50 is in):
// - P in [2^-76, 2^76] for every kept score (masked ones are 2^-inf = 0);
//   a row's largest P is at least 2^-76 (the offset softmax's is 1), so the
//   f32 products P v stay normal for |v| >= 2^-50, and the f32 sums of P v
//   stay finite while (keys x max |v|) < 2^52 (4.5e15);
// - bf16 only: f16's range (2^-24 .. 65504) cannot hold 2^(+-mult) for a
//   useful cap, so f16 keeps the running maximum.
#pragma once

#include "cuda/fused/params.hpp"

namespace gqattn::fused {

enum class ScoreMode {
  plain,                    // no softcap: online softmax with the running row maximum
  softcap,                  // softcap, then the same online softmax
  softcap_without_row_max,  // softcap, P = 2^(v mult) with no offset (see above)
};

// Without the row maximum no P is exactly 1, so o is normalised by the row
// sums of the 16-bit P its numerator used (the kernels form them on the
// tensor cores: P times ones), not by the f32 sums, which left one-key rows
// over the oracle's tolerance after the backward; lse still comes from the
// f32 sums. Measured: docs/decisions/fused-softcap-without-row-max.md.

// The largest mult (= cap log2 e) the no-offset mode takes.
constexpr float kMaxUnshiftedExponent = 76.0f;

inline ScoreMode score_mode(const ScoreArgs& score, ElemType elem) {
  if (!score.softcap) return ScoreMode::plain;
  if (elem == ElemType::bf16 && score.mult <= kMaxUnshiftedExponent)
    return ScoreMode::softcap_without_row_max;
  return ScoreMode::softcap;
}

constexpr bool has_softcap(ScoreMode mode) { return mode != ScoreMode::plain; }

}  // namespace gqattn::fused
