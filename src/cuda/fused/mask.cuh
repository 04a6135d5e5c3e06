// cuda-flash: the one mask policy of the fused kernels (bounds, causal
// bottom-right aligned, sliding window) and the logit soft-cap. It answers
// both "which tiles does this query (or key) tile visit, and which of them
// need element masking" and "mask this tile"; tiles it skips are never
// loaded, tiles it calls fully kept are never masked. Checked against the f64
// oracle through tests/gpu/test_flash_*.cpp (causal, windows 1/64/>=T,
// Tq != Tk both ways, rows with no kept key, softcap with large logits).
//
// Semantics (DESIGN §1): off = Tk - Tq; key j is kept for query i iff
// 0 <= i < Tq, 0 <= j < Tk, (!causal or j <= i + off) and
// (window == 0 or j >= i + off - window + 1). Indices are int: the backend
// refuses Tq, Tk >= 2^30, so i + off, j - off + window stay in range.
#pragma once

#include <cmath>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/params.hpp"

namespace gqattn::fused {

struct BlockRange {
  int first = 0;
  int last = -1;  // inclusive; last < first: nothing to visit
};

struct MaskPolicy {
  int tq, tk, off, window;
  bool causal;

  __device__ explicit MaskPolicy(const MaskArgs& m)
      : tq(m.tq), tk(m.tk), off(m.tk - m.tq), window(m.window), causal(m.causal) {}

  // Kept keys of query i are [key_lo(i), key_hi(i)]; both nondecreasing in i.
  __device__ __forceinline__ int key_lo(int i) const {
    return window > 0 ? max(0, i + off - window + 1) : 0;
  }
  __device__ __forceinline__ int key_hi(int i) const {
    return causal ? min(tk - 1, i + off) : tk - 1;
  }
  // Queries that keep key j are [query_lo(j), query_hi(j)].
  __device__ __forceinline__ int query_lo(int j) const { return causal ? max(0, j - off) : 0; }
  __device__ __forceinline__ int query_hi(int j) const {
    return window > 0 ? min(tq - 1, j - off + window - 1) : tq - 1;
  }

  // Key blocks of size bn that query rows [m0, m0 + rows) visit; rows
  // outside [0, Tq) visit none (a tile may reach past Tq, and cuda-hopper's
  // end-aligned causal tiles start before row 0). row_shift > 0:
  // cuda-hopper's packed GQA rows, row r holding query r >> row_shift
  // (hopper/pack_gqa.hpp; m0 >= 0 there).
  __device__ BlockRange key_blocks(int m0, int rows, int bn, int row_shift = 0) const {
    const int first = max(m0, 0) >> row_shift;
    const int last = min((m0 + rows - 1) >> row_shift, tq - 1);
    if (last < first) return {};
    const int lo = key_lo(first), hi = key_hi(last);
    if (hi < lo) return {};
    return {lo / bn, hi / bn};
  }
  // Query blocks of size bm that keys [n0, n0 + cols) are visited by.
  __device__ BlockRange query_blocks(int n0, int cols, int bm) const {
    const int lo = query_lo(n0), hi = query_hi(n0 + cols - 1);
    if (hi < lo) return {};
    return {lo / bm, hi / bm};
  }

  // True when every (i, j) of the full bm x bn tile at (m0, n0) is kept, so
  // the tile needs no element masking. Tiles that cross Tq or Tk never are,
  // nor tiles with rows before row 0 (cuda-hopper's end-aligned query tiles).
  __device__ bool fully_kept(int m0, int bm, int n0, int bn) const {
    if (m0 < 0 || m0 + bm > tq || n0 + bn > tk) return false;
    if (causal && n0 + bn - 1 > m0 + off) return false;
    if (window > 0 && n0 < m0 + bm - 1 + off - window + 1) return false;
    return true;
  }
  // The same for the queries [first, last] (first < 0: rows before row 0),
  // whatever rows hold them (cuda-hopper's packed GQA rows: the caller
  // shifts its rows once per tile, outside the key loop).
  __device__ bool queries_fully_kept(int first, int last, int n0, int bn) const {
    if (first < 0 || last >= tq || n0 + bn > tk) return false;
    if (causal && n0 + bn - 1 > first + off) return false;
    if (window > 0 && n0 < last + off - window + 1) return false;
    return true;
  }

  // Sets every masked element of a warp's accumulator tiles to `fill` (-inf
  // on scores before the softmax, 0 on probabilities in the backward).
  // acc[mt][nt] is the C fragment of rows row0 + 16 mt.., columns col0 + 8 nt..
  // kRowsAreKeys: rows index keys and columns queries (the transposed S^T of
  // the dK/dV kernel); otherwise rows are queries, row r query r >>
  // row_shift (> 0: cuda-hopper's packed GQA rows, hopper/pack_gqa.hpp).
  template <bool kRowsAreKeys, int kMT, int kNT>
  __device__ __forceinline__ void apply(float (&acc)[kMT][kNT][4], int row0, int col0, int lane,
                                        float fill, int row_shift = 0) const {
    // Branch-free: per row the kept columns are one interval [lo, hi].
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + mt * kMmaM + frag_row(lane) + half * kFragRowHalf;
        int lo, hi;
        if (kRowsAreKeys) {  // row = key j, columns = queries i
          lo = query_lo(row);
          hi = row < tk ? query_hi(row) : -1;
        } else {  // row = query i, columns = keys j; rows outside [0, Tq) keep none
          const int i = row >> row_shift;
          lo = key_lo(i);
          hi = unsigned(i) < unsigned(tq) ? key_hi(i) : -1;
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = col0 + nt * kMmaN + frag_col(lane) + e;
            float& x = acc[mt][nt][2 * half + e];
            x = (col >= lo) & (col <= hi) ? x : fill;
          }
      }
  }
};

// r = 1 / (e^(2y) + 1) for y = s pre, given k = 2 log2(e) pre: one ex2 and
// one rcp on the special function unit (rcp.approx: relative error 2^-23).
// Every softcap form is built on it: tanh(y) = 1 - 2r, the forward's
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
  constexpr float kTwoLog2e = 2.0f * 1.4426950408889634f;
  return fmaf(softcap_r(x, kTwoLog2e), -2.0f, 1.0f);
}

// v = tanh(s * pre) on every element (ScoreArgs: the capped logit is cap * v).
template <int kMT, int kNT>
__device__ __forceinline__ void apply_softcap(float (&acc)[kMT][kNT][4], float pre) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = softcap_tanh(acc[mt][nt][e] * pre);
}

// The exponents v mult (v = tanh(s pre)) on every element, for
// ScoreMode::softcap_without_row_max (score_mode.hpp): mult folded into
// softcap_tanh's last step, mult tanh(y) = mult - 2 mult r: mul, ex2, add,
// rcp, fma.
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_exponents(float (&acc)[kMT][kNT][4], float pre,
                                                  float mult) {
  constexpr float kTwoLog2e = 2.0f * 1.4426950408889634f;
  const float k = kTwoLog2e * pre;
  const float minus_two_mult = -2.0f * mult;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[mt][nt][e] = fmaf(softcap_r(acc[mt][nt][e], k), minus_two_mult, mult);
}

}  // namespace gqattn::fused
