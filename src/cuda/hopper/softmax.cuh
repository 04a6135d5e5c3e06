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
//
// Lazy rescaling (FlashAttention-4's; kLazyRescale in tile_sizes.hpp): the
// reference maximum of a row need not be the row's true maximum, only an
// upper bound of (true maximum - kLazyRescaleLog2 / mult): every p is then at
// most 2^kLazyRescaleLog2, which f32 sums and O and the 16-bit P hold with
// the same relative precision as p <= 1 (no overflow, no extra rounding),
// and O / sum and lse = (max mult + log2 sum) ln 2 are the same quantities.
// So a warp keeps its rows' reference maxima, and skips O's rescale (d / 2
// multiplies per thread) and alpha's exponential, unless one of its rows
// grew by more than that; then every row of the warp moves to its true
// maximum, as without the switch. The vote keeps the branch warp-uniform.
// A row whose reference is -inf and that now has a kept score grows by
// +inf: it always takes the reference (a fully masked row's -inf - -inf is
// NaN, which compares false: it stays at -inf, offset 0, p 0).
#pragma once

#include <cmath>

#include "cuda/flash/mma.cuh"
#include "cuda/flash/softmax.cuh"
#include "cuda/hopper/tile_sizes.hpp"

namespace gqattn::hopper {

using RowSoftmax = flash::OnlineSoftmax<1>;
constexpr int kSoftmaxRows = RowSoftmax::kRows;  // rows g and g + 8

// s: this tile's scores (masked to -inf), replaced by p; alpha[r]: the factor
// that brings O of row r to the new reference maximum. Returns whether O
// must be rescaled by alpha (warp-uniform; always true without kLazy, and
// alpha is then unset when false). kFmaExp2Quarters: the share of p
// computed on the FMA pipe (flash::softmax_exp2).
template <int kFmaExp2Quarters, bool kLazy, int kNT>
__device__ __forceinline__ bool scores_to_p(RowSoftmax& sm, float (&s)[1][kNT][4],
                                            float (&alpha)[kSoftmaxRows]) {
  float mx[kSoftmaxRows];
  bool grew = false;  // some row of this thread outgrew its reference by > kLazyRescaleLog2
#pragma unroll
  for (int half = 0; half < kSoftmaxRows; ++half) {
    mx[half] = sm.row_max[half];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      mx[half] = fmaxf(mx[half], fmaxf(s[0][nt][2 * half], s[0][nt][2 * half + 1]));
    mx[half] = flash::quad_max(mx[half]);
    grew |= (mx[half] - sm.row_max[half]) * sm.mult > kLazyRescaleLog2;
  }
  const bool rescale = !kLazy || __any_sync(0xffffffffu, grew);
#pragma unroll
  for (int half = 0; half < kSoftmaxRows; ++half) {
    if (rescale) {
      const float offset = (mx[half] == -INFINITY ? 0.0f : mx[half]) * sm.mult;
      alpha[half] = flash::fast_exp2(sm.row_max[half] * sm.mult - offset);
      sm.row_max[half] = mx[half];
    }
    const float ref = sm.row_max[half];
    const float offset = (ref == -INFINITY ? 0.0f : ref) * sm.mult;
    float sum = rescale ? sm.row_sum[half] * alpha[half] : sm.row_sum[half];
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
  return rescale;
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
