// The one mask policy of the fused kernels (bounds, causal bottom-right
// aligned, sliding window; the logit soft-cap is softcap.cuh's). It answers
// both "which tiles does this query (or key) tile visit, and which of them
// need element masking" and "mask this tile"; tiles it skips are never
// loaded, tiles it calls fully kept are never masked. Checked against the f64
// oracle through tests/gpu/test_flash_*.cpp and test_hopper_*.cpp (causal,
// windows 1/64/>=T, Tq != Tk both ways, rows with no kept key).
//
// Semantics (docs/semantics.md): off = q_start (Tk - Tq unless given); key j
// is kept for query i iff 0 <= i < Tq, 0 <= j < Tk, (!causal or j <= i + off)
// and (window == 0 or j >= i + off - window + 1). Indices are int: the
// backends refuse Tq, Tk, |q_start| >= 2^30, and the window is below
// off + Tq (MaskArgs), so i + off, j - off + window stay in range. One
// policy per sequence: a varlen batch's come from sequence.hpp.
#pragma once

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
      : tq(m.tq), tk(m.tk), off(m.off), window(m.window), causal(m.causal) {}

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
  // (hopper/forward/pack_gqa.hpp; m0 >= 0 there).
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
  // row_shift (> 0: cuda-hopper's packed GQA rows, hopper/forward/pack_gqa.hpp).
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

}  // namespace gqattn::fused
