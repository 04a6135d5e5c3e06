// cuda-hopper: cuda-flash's online softmax (flash::OnlineSoftmax<1>, one m16
// tile of rows g and g + 8 per thread) split in two, for the overlapped main
// loop of consumer.cuh: scores_to_p() turns a score tile into P and returns
// the per-row rescale factors without touching O (which a P V wgmma may
// still be accumulating), rescale_o() applies them once that wgmma has
// completed. Same arithmetic, in the same order, as OnlineSoftmax::update;
// finalize() is OnlineSoftmax's. Checked against the f64 oracle by
// tests/gpu/test_hopper_forward.cpp. ScoreMode::softcap_without_row_max
// (flash/score_mode.hpp) uses OnlineSoftmax's start_unshifted() and
// update_unshifted() as they are.
//
// Invariants (OnlineSoftmax's): a row whose every score so far was masked
// has max -inf and offset 0, so its p are 0, its sum stays 0 and finalize
// gives o = 0, lse = -inf; alpha is 0 on a row's first kept tile (O is 0
// there anyway).
#pragma once

#include <cmath>

#include "cuda/flash/mma.cuh"
#include "cuda/flash/softmax.cuh"

namespace gqattn::hopper {

using RowSoftmax = flash::OnlineSoftmax<1>;
constexpr int kSoftmaxRows = RowSoftmax::kRows;  // rows g and g + 8

// s: this tile's scores (masked to -inf), replaced by p; alpha[r]: the factor
// that brings O of row r to the new row maximum. kFmaExp2Quarters: the share
// of p computed on the FMA pipe (flash::softmax_exp2).
template <int kFmaExp2Quarters, int kNT>
__device__ __forceinline__ void scores_to_p(RowSoftmax& sm, float (&s)[1][kNT][4],
                                            float (&alpha)[kSoftmaxRows]) {
#pragma unroll
  for (int half = 0; half < kSoftmaxRows; ++half) {
    float mx = sm.row_max[half];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      mx = fmaxf(mx, fmaxf(s[0][nt][2 * half], s[0][nt][2 * half + 1]));
    mx = flash::quad_max(mx);
    const float offset = (mx == -INFINITY ? 0.0f : mx) * sm.mult;
    alpha[half] = flash::fast_exp2(sm.row_max[half] * sm.mult - offset);
    sm.row_max[half] = mx;
    float sum = sm.row_sum[half] * alpha[half];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        const float p =
            flash::softmax_exp2<kFmaExp2Quarters>(fmaf(s[0][nt][e], sm.mult, -offset), nt);
        s[0][nt][e] = p;
        sum += p;
      }
    sm.row_sum[half] = sum;
  }
}

template <int kDT>
__device__ __forceinline__ void rescale_o(float (&o)[1][kDT][4],
                                          const float (&alpha)[kSoftmaxRows]) {
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int half = 0; half < kSoftmaxRows; ++half) {
      o[0][dt][2 * half] *= alpha[half];
      o[0][dt][2 * half + 1] *= alpha[half];
    }
}

}  // namespace gqattn::hopper
