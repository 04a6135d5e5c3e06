// The fused forwards' online softmax over key tiles, in the exp2
// domain (see ScoreArgs in params.hpp: p = 2^(v * mult - m * mult)). Each
// thread owns two rows (g and g+8) of each of its warp's m16 tiles; row
// maxima are reduced over the quad at every tile, row sums only at the end.
// Checked against the f64 oracle through tests/gpu/test_flash_*.cpp (large
// rows, softcap, rows with no kept key).
//
// update_unshifted() is the no-offset variant of ScoreMode::
// softcap_without_row_max (score_mode.hpp): no maximum, no rescale. Its
// kFmaExp2Quarters (0 in cuda-flash) moves that share of the exponentials
// from the MUFU to the FMA pipe (softmax_exp2, exp2_fma.hpp).
//
// Invariants: a row whose every element so far was masked has max -inf; the
// exponent offset then uses 0 instead (never -inf - -inf), so its p are 0,
// its sum stays 0, and finalize() gives o = 0 and lse = -inf.
//
// Lazy rescaling (FlashAttention-4's; kLazy): a row's reference maximum
// row_max need not be its true maximum, only at least (true maximum -
// kLazyLog2 / mult): every p is then at most 2^kLazyLog2,
// which the f32 sums and O and the 16-bit P hold without overflow, and
// O / sum and lse = (row_max mult + log2 sum) ln 2 are the same quantities.
// So a warp keeps its rows' references, and skips O's rescale (a multiply
// per element of O) and alpha's exponentials, unless one of its rows grew
// by more than that; then every row of the warp moves to its true maximum,
// as without kLazy. The vote keeps the branch warp-uniform. One precision
// difference: the row's largest p is no longer exactly 1, so its 16-bit
// rounding in O's numerator is not matched by the f32 sum, and o divided by
// that sum carries an error common to its columns that the backward's D =
// rowsum(dO o O) amplifies (docs/decisions/flash-forward-lazy-rescale.md
// has the failing case). The cure
// (kCompensate, any kLazyLog2 > 0): each thread adds, per row and tile,
// the 16-bit rounding error of its own largest p to row_fix, and
// finalize_compensated divides o by row_sum + row_fix (lse keeps the f32
// sums): the p that the eager form holds exactly (the row's largest) is
// among these, so o's error common to its columns is no larger than the
// eager form's, at one exponential per row and tile. A threshold of 0
// keeps the reference exact and needs no cure. A row whose reference is -inf
// and that now has a kept score grows by +inf, so it always takes the
// reference; a still fully masked row's -inf - -inf is NaN, which compares
// false: it stays at -inf (offset 0, p 0).
#pragma once

#include <cmath>
#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/fused/exp2_fma.hpp"
#include "cuda/fused/fragment.cuh"

namespace gqattn::fused {

constexpr float kLn2 = 0.6931471805599453f;

// 2^x of a score in n8 block nt of a tile: blocks with nt % 4 below
// kFmaExp2Quarters on the FMA pipe (exp2_fma), the others on the MUFU
// (fast_exp2). nt is an unrolled loop index, so the choice is compiled in.
// Both give +0 for x = -inf (masked).
template <int kFmaExp2Quarters>
__device__ __forceinline__ float softmax_exp2(float x, int nt) {
  static_assert(kFmaExp2Quarters >= 0 && kFmaExp2Quarters <= 4, "a share in quarters");
  return nt % 4 < kFmaExp2Quarters ? exp2_fma(x) : fast_exp2(x);
}

// kMT: m16 tiles of rows per thread. kLazyLog2: lazy rescaling's bound on
// p as a power of two (FlashAttention-4's 8), used where scores_to_p and
// update run with kLazy. 0: a warp skips the rescale only where none of its
// rows' maxima changed, which gives the eager form's results bit for bit
// (alpha would be 2^0 = 1) and needs no compensation.
template <int kMT, int kLazyLog2 = 0>
struct OnlineSoftmax {
  static_assert(kLazyLog2 >= 0 && kLazyLog2 <= 8, "p up to 2^8 keeps O, the sums and P in range");
  static constexpr bool kCompensate = kLazyLog2 > 0;
  static constexpr int kRows = 2 * kMT;  // rows per thread
  float row_max[kRows];                  // in units of v (before * mult)
  float row_sum[kRows];                  // this thread's partial sums of p
  // With kCompensate: this thread's sum of (16-bit p - p) over its
  // largest p of each row and tile (scaled with row_sum).
  float row_fix[kRows];
  float mult;

  __device__ explicit OnlineSoftmax(float mult_) : mult(mult_) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
      if constexpr (kCompensate) row_fix[r] = 0.0f;  // else never read
    }
  }

  // s: this tile's scores (v, masked to -inf), replaced by p; alpha[r]: the
  // factor that brings O's row r to its new reference maximum (0 on a row's
  // first kept tile). Returns whether O must be rescaled by alpha: always
  // without kLazy; with it, warp-uniformly, and alpha is unset when not.
  // Split from the rescale for cuda-hopper, whose O may still be an
  // in-flight wgmma accumulator here. Elem: the 16-bit type P is rounded to
  // for O's numerator (needed by kLazy with kCompensate).
  template <bool kLazy, int kFmaExp2Quarters = 0, typename Elem = void, int kNT>
  __device__ __forceinline__ bool scores_to_p(float (&s)[kMT][kNT][4], float (&alpha)[kRows]) {
    if constexpr (!kLazy) {  // row by row, in the order the eager form always had
#pragma unroll
      for (int r = 0; r < kRows; ++r) alpha[r] = eager_row_to_p<kFmaExp2Quarters>(s, r);
      return true;
    }
    static_assert(!kCompensate || !std::is_void_v<Elem>,
                  "a threshold above 0 needs P's 16-bit type to compensate its rounding");
    static_assert(!kCompensate || kFmaExp2Quarters == 0,
                  "the compensation recomputes the largest p on the MUFU, as P's must be");
    float mx[kRows];
    float own_max[kRows];  // with kCompensate: this thread's largest score of the row
    bool grew = false;     // a row of this thread outgrew its reference by > kLazyLog2
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if constexpr (kCompensate) {
        own_max[r] = thread_row_max(s, r, -INFINITY);
        mx[r] = quad_max(fmaxf(own_max[r], row_max[r]));
      } else {
        mx[r] = tile_row_max(s, r);
      }
      grew |= (mx[r] - row_max[r]) * mult > float(kLazyLog2);
    }
    const bool rescale = __any_sync(0xffffffffu, grew);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (rescale) {
        const float offset = (mx[r] == -INFINITY ? 0.0f : mx[r]) * mult;
        alpha[r] = fast_exp2(row_max[r] * mult - offset);
        row_max[r] = mx[r];
      }
      const float offset = (row_max[r] == -INFINITY ? 0.0f : row_max[r]) * mult;
      row_sum[r] =
          exp_and_sum<kFmaExp2Quarters>(s, r, offset, rescale ? row_sum[r] * alpha[r] : row_sum[r]);
      if constexpr (kCompensate) {
        // The same expression as exp_and_sum's, so the same bits as that
        // element's p (an all-masked thread row gives 2^-inf = 0, no fix).
        const float top = fast_exp2(fmaf(own_max[r], mult, -offset));
        // Rounded to nearest even, as pack2 gives P to the tensor cores.
        const float fix = gqattn::cuda::load_f32(gqattn::cuda::store_as<Elem>(top)) - top;
        row_fix[r] = (rescale ? row_fix[r] * alpha[r] : row_fix[r]) + fix;
      }
    }
    return rescale;
  }

  // o *= alpha, row by row (after scores_to_p returned true).
  template <int kDT>
  __device__ __forceinline__ void rescale(float (&o)[kMT][kDT][4],
                                          const float (&alpha)[kRows]) const {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          o[mt][dt][2 * half] *= alpha[mt * 2 + half];
          o[mt][dt][2 * half + 1] *= alpha[mt * 2 + half];
        }
  }

  // Both: s becomes p, o is rescaled to the new reference maxima (Elem as
  // for scores_to_p).
  template <bool kLazy, typename Elem = void, int kNT, int kDT>
  __device__ __forceinline__ void update(float (&s)[kMT][kNT][4], float (&o)[kMT][kDT][4]) {
    if constexpr (!kLazy) {  // each row's rescale right after its p, as always
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float alpha = eager_row_to_p<0>(s, r);
        scale_row(o, r / 2, r % 2, alpha);
      }
    } else {
      float alpha[kRows];
      if (scores_to_p<true, 0, Elem>(s, alpha)) rescale(o, alpha);
    }
  }

  // ScoreMode::softcap_without_row_max (score_mode.hpp), called once before
  // the first update_unshifted(): the row maxima stay 0 for good, so
  // finalize() gives lse = log(sum) (and -inf, o = 0 for a row with no kept
  // key, whose sum stays 0).
  __device__ __forceinline__ void start_unshifted() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) row_max[r] = 0.0f;
  }

  // The same mode's update. x: this tile's exponents v mult (|x| <=
  // kMaxUnshiftedExponent, masked ones -inf), replaced by p = 2^x; no
  // maximum, so O is never rescaled.
  template <int kFmaExp2Quarters = 0, int kNT>
  __device__ __forceinline__ void update_unshifted(float (&x)[kMT][kNT][4]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        float sum = row_sum[r];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 2 * half; e < 2 * half + 2; ++e) {
            const float p = softmax_exp2<kFmaExp2Quarters>(x[mt][nt][e], nt);
            x[mt][nt][e] = p;
            sum += p;
          }
        row_sum[r] = sum;
      }
  }

  // finalize() of the same mode: o is normalised by weight_sums, the row
  // sums of the 16-bit P that o's numerator multiplied (an m16n8
  // accumulator per m16 tile whose every column is the row sum: P times
  // ones on the tensor cores), so a row with one dominant key gets exactly
  // that key's v; lse comes from the f32 sums of P as in finalize(). A row
  // with no kept key has both sums 0: o = 0, lse = -inf.
  template <int kDT>
  __device__ __forceinline__ void finalize_unshifted(float (&o)[kMT][kDT][4], float (&lse)[kRows],
                                                     const float (&weight_sums)[kMT][4]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        const float sum = quad_sum(row_sum[r]);
        const float weights = weight_sums[mt][2 * half];  // rows g and g + 8 of the C fragment
        lse[r] = sum > 0.0f ? log2f(sum) * kLn2 : -INFINITY;
        const float inv = weights > 0.0f ? 1.0f / weights : 0.0f;
        scale_row(o, mt, half, inv);
      }
  }

  // The running-maximum mode's end after lazy rescaling with
  // kCompensate: o is normalised by the f32 sums plus the compensation
  // (row_fix), lse comes from the f32 sums alone, as in finalize(). A row
  // with no kept key has both 0: o = 0, lse = -inf.
  template <int kDT>
  __device__ __forceinline__ void finalize_compensated(float (&o)[kMT][kDT][4],
                                                       float (&lse)[kRows]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        const float sum = quad_sum(row_sum[r]);
        const float weights = quad_sum(row_sum[r] + row_fix[r]);
        lse[r] = sum > 0.0f ? (row_max[r] * mult + log2f(sum)) * kLn2 : -INFINITY;
        const float inv = weights > 0.0f ? 1.0f / weights : 0.0f;
        scale_row(o, mt, half, inv);
      }
  }

  // o's row (mt, half) times inv.
  template <int kDT>
  __device__ __forceinline__ static void scale_row(float (&o)[kMT][kDT][4], int mt, int half,
                                                   float inv) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      o[mt][dt][2 * half] *= inv;
      o[mt][dt][2 * half + 1] *= inv;
    }
  }

  // The larger of `from` and row r's (= tile mt = r / 2, half r % 2)
  // largest score among this thread's columns of the tile (not reduced
  // over the quad).
  template <int kNT>
  __device__ __forceinline__ float thread_row_max(const float (&s)[kMT][kNT][4], int r,
                                                  float from) const {
    const int mt = r / 2, half = r % 2;
    float mx = from;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      mx = fmaxf(mx, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
    return mx;
  }

  // Row r's maximum over this tile and its reference, reduced over the quad.
  template <int kNT>
  __device__ __forceinline__ float tile_row_max(const float (&s)[kMT][kNT][4], int r) const {
    return quad_max(thread_row_max(s, r, row_max[r]));
  }

  // The eager step of row r: its reference becomes its true maximum, its
  // scores p, its sum is rescaled and grows by them; returns alpha.
  template <int kFmaExp2Quarters, int kNT>
  __device__ __forceinline__ float eager_row_to_p(float (&s)[kMT][kNT][4], int r) {
    const float mx = tile_row_max(s, r);
    const float offset = (mx == -INFINITY ? 0.0f : mx) * mult;
    const float alpha = fast_exp2(row_max[r] * mult - offset);
    row_max[r] = mx;
    row_sum[r] = exp_and_sum<kFmaExp2Quarters>(s, r, offset, row_sum[r] * alpha);
    return alpha;
  }

  // Row r's scores become p = 2^(s mult - offset); returns sum plus their sum.
  template <int kFmaExp2Quarters, int kNT>
  __device__ __forceinline__ float exp_and_sum(float (&s)[kMT][kNT][4], int r, float offset,
                                               float sum) const {
    const int mt = r / 2, half = r % 2;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        const float p = softmax_exp2<kFmaExp2Quarters>(fmaf(s[mt][nt][e], mult, -offset), nt);
        s[mt][nt][e] = p;
        sum += p;
      }
    return sum;
  }

  // Normalises o by the row sums; returns each row's lse (natural log) in
  // lse[r] (-inf for a row with no kept key, whose o becomes 0).
  template <int kDT>
  __device__ __forceinline__ void finalize(float (&o)[kMT][kDT][4], float (&lse)[kRows]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        const float sum = quad_sum(row_sum[r]);
        const bool any = sum > 0.0f;
        const float inv = any ? 1.0f / sum : 0.0f;
        lse[r] = any ? (row_max[r] * mult + log2f(sum)) * kLn2 : -INFINITY;
        scale_row(o, mt, half, inv);
      }
  }
};

}  // namespace gqattn::fused
