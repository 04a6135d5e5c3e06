// cuda-hopper: device helpers shared by the backward's dK/dV and dQ kernels:
// the shared-memory matrix descriptors of K-major and MN-major operands,
// loading a [rows x d] tile by TMA as 64-row boxes, and the plain stores of
// a warpgroup's f32 accumulator rows, P and dP - D from the recomputed S and
// dP (both kernels, either orientation). Checked by compiling for sm_90a
// (`-Xptxas -v`, SASS HGMMA) and by tests/gpu/test_hopper_backward.cpp.
//
// Shared-memory tiles (as in the forward, docs/backends/cuda-hopper.md): a [rows x d]
// tile is d/64 column blocks of [rows][64] elements (128-byte rows, 128-byte
// swizzle), each block starting on a 1024-byte boundary (descriptor base
// offset 0). A consumer warpgroup's 64-row slice of a taller tile starts
// 64 x 128 = 8192 bytes further, still a multiple of 1024.
// - K-major operand (the reduction runs along d: Q, K, V, dO in S = Q K^T,
//   dP = dO V^T and their transposes): a k16 step moves 32 bytes along the
//   row, every 4 steps the next column block (rows x 128 bytes further);
//   8-row groups 1024 bytes apart (SBO); LBO unused.
// - MN-major operand (the reduction runs along the rows, N along d: dO, Q in
//   dV += P^T dO and dK += dS^T Q, K in dQ += dS K): a k16 step is 16 rows =
//   2048 bytes; SBO = 1024 (next 8 rows, K direction); LBO = rows x 128
//   bytes (next 64 columns of d, N direction: the next column block).
#pragma once

#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/fused/softcap.cuh"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/backward/tile_sizes.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/ptx/tma.cuh"
#include "cuda/hopper/ptx/wgmma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GQATTN_HOPPER_BWD_DEVICE_CODE 1
#endif

namespace gqattn::hopper::bwd {

constexpr uint32_t kKStepBytes = kWgmmaK * kElemBytes;            // 32: one k16 step along a row
constexpr uint32_t kStepsPerColBlock = kColBlock / kWgmmaK;       // 4
constexpr uint32_t kRowGroupBytes = kSwizzleAtomBytes;            // SBO: 8 rows x 128 B
constexpr uint32_t kUnusedLbo = 16;                               // K-major swizzled: ignored
constexpr uint32_t kRowStepBytes = kWgmmaK * kSwizzleBytes;       // 16 rows of one column block
constexpr uint32_t kWarpgroupRowBytes = kWgmmaM * kSwizzleBytes;  // 64 rows: 8192

// One mbarrier arrival per consumer warp releases a slot; the producer's
// arrive.expect_tx is the only arrival on a full barrier.
constexpr uint32_t kEmptyArrivals = kBwdConsumerWarps;
constexpr uint32_t kFullArrivals = 1;

// K-step kk of a K-major operand whose column blocks hold kBlockRows rows;
// `base` is the operand's first row (a tile, or a warpgroup's slice of it).
// (kk a constant after unrolling: one descriptor per operand, the k-steps
// by adds, as the forward's consumer.cuh.)
template <int kBlockRows>
__device__ __forceinline__ uint64_t k_major(uint32_t base, int kk) {
  const uint32_t offset =
      uint32_t(kk) / kStepsPerColBlock * (uint32_t(kBlockRows) * kSwizzleBytes) +
      uint32_t(kk) % kStepsPerColBlock * kKStepBytes;
  return ptx::desc_advance(ptx::make_desc_sw128(base, kUnusedLbo, kRowGroupBytes), offset);
}

// K-step kk (rows 16 kk .. 16 kk + 15) of an MN-major operand: a tile of
// kBlockRows rows whose N runs along d.
template <int kBlockRows>
__device__ __forceinline__ uint64_t mn_major(uint32_t tile, int kk) {
  return ptx::desc_advance(
      ptx::make_desc_sw128(tile, uint32_t(kBlockRows) * kSwizzleBytes, kRowGroupBytes),
      uint32_t(kk) * kRowStepBytes);
}

// Copies rows [row0, row0 + kRows) of (head, batch) of `map` (boxes of
// kBox rows: kBoxRows, or kv_box_rows(d) for k and v) into the tile at `dst`
// (d/64 blocks of [kRows][64]); the bytes complete on `bar`. Rows past the
// tensor's end arrive as zeros and still count kRows x d x 2 bytes.
template <int kD, int kRows, int kBox = kBoxRows>
__device__ __forceinline__ void load_rows(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                          int row0, int head, int batch) {
  static_assert(kRows % kBox == 0, "tiles are whole boxes");
  constexpr uint32_t kBlockBytes = uint32_t(kRows) * kSwizzleBytes;
  constexpr uint32_t kBoxBytes = uint32_t(kBox) * kSwizzleBytes;
  static_assert(kBoxBytes % kSwizzleAtomBytes == 0, "boxes start on 1024-byte boundaries");
#pragma unroll
  for (int c = 0; c < kD / kColBlock; ++c)
#pragma unroll
    for (int r = 0; r < kRows / kBox; ++r)
      ptx::tma_load_4d(dst + c * kBlockBytes + r * kBoxBytes, map, bar, c * kColBlock, head,
                       row0 + r * kBox, batch);
}

// Stores a consumer warp's 16 accumulator rows (times `mult`) to `out` +
// row * row_stride, rows `row0 + g` and `row0 + g + 8`, those < `rows_end`
// only, and columns < `cols` only (a padded head dim's tensors have fewer
// than kD); two columns per 32-bit store (the output's strides are even and
// its data 4-byte aligned: hopper_backend.cpp's why_not_tensor).
template <int kD, typename Elem>
__device__ __forceinline__ void store_rows(Elem* out, int64_t row_stride, int row0, int rows_end,
                                           int cols, const float (&acc)[kD / 8][4], float mult) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int col0 = fused::frag_col(lane);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + fused::frag_row(lane) + half * fused::kFragRowHalf;
    if (row >= rows_end) continue;
    Elem* dst = out + int64_t(row) * row_stride + col0;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i)
      if (i * 8 < cols)
        *reinterpret_cast<uint32_t*>(dst + i * 8) =
            fused::pack2<Elem>(acc[i][2 * half] * mult, acc[i][2 * half + 1] * mult);
  }
}

// dS = P o dp packed as the 16-bit A fragment of k-step kk (n8 blocks 2kk,
// 2kk + 1 of the accumulators, see ptx/wgmma.cuh).
template <typename Elem, int kNT>
__device__ __forceinline__ void ds_to_a(uint32_t (&a)[4], const float (&p)[kNT][4],
                                        const float (&dp)[kNT][4], int kk) {
  const float(&p0)[4] = p[2 * kk];
  const float(&p1)[4] = p[2 * kk + 1];
  const float(&d0)[4] = dp[2 * kk];
  const float(&d1)[4] = dp[2 * kk + 1];
  a[0] = fused::pack2<Elem>(p0[0] * d0[0], p0[1] * d0[1]);
  a[1] = fused::pack2<Elem>(p0[2] * d0[2], p0[3] * d0[3]);
  a[2] = fused::pack2<Elem>(p1[0] * d1[0], p1[1] * d1[1]);
  a[3] = fused::pack2<Elem>(p1[2] * d1[2], p1[3] * d1[3]);
}

// Index into lse2 / dsum of accumulator element (nt, e): the column's
// (kRowsAreKeys: the dK/dV kernel's S^T, dP^T, columns are queries; lse2,
// dsum are the step slot's rows in shared memory) or the row's (dQ kernel:
// rows are queries; lse2[r], dsum[r] hold this thread's rows g + 8 r).
template <bool kRowsAreKeys>
__device__ __forceinline__ int stat_index(int nt, int e, int lane) {
  return kRowsAreKeys ? nt * fused::kMmaN + fused::frag_col(lane) + (e & 1) : e / 2;
}

// The lse2 or dsum value of accumulator element (nt, e). kPairLoads (rows
// are keys only): the block's two columns of this thread are adjacent and
// 8-byte aligned, so one 64-bit load serves elements 0-3 (ptxas issues two
// 32-bit loads for the scalar form and does not merge them); it is the
// caller's choice because in the softcap dK/dV kernels, at R237 of 240, the
// pair's longer-lived register made ptxas spill 12 bytes.
template <bool kRowsAreKeys, bool kPairLoads>
__device__ __forceinline__ float stat_value(const float* stat, int nt, int e, int lane) {
  static_assert(kRowsAreKeys || !kPairLoads, "pairs are the columns of one row's block");
  if constexpr (kPairLoads) {
    const float2 pair = *reinterpret_cast<const float2*>(stat + stat_index<true>(nt, 0, lane));
    return (e & 1) ? pair.y : pair.x;
  } else {
    return stat[stat_index<kRowsAreKeys>(nt, e, lane)];
  }
}

// s <- P = 2^(s * mult - lse2) with masked elements 0; `mult` is
// ScoreArgs::mult, or under softcap, where s holds r (p_and_ds_factor) and
// the workspace lse2 - mult, -2 mult. The warpgroup's tile is rows
// [wg_row0, wg_row0 + kWgmmaM) (this warp's from warp_row0) by columns
// [col0, col0 + 8 kNT); the mask is applied only when some element of it is
// not kept. Queries past Tq have lse2 = +inf: P = 0.
template <bool kRowsAreKeys, int kNT, bool kPairLoads = false>
__device__ __forceinline__ void p_from_scores(float (&s)[1][kNT][4], const float* lse2, float mult,
                                              const fused::MaskPolicy& mask, int wg_row0,
                                              int warp_row0, int col0, int lane) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[0][nt][e] = fused::fast_exp2(
          fmaf(s[0][nt][e], mult, -stat_value<kRowsAreKeys, kPairLoads>(lse2, nt, e, lane)));
  constexpr int kCols = kNT * fused::kMmaN;
  const bool kept = kRowsAreKeys ? mask.fully_kept(col0, kCols, wg_row0, kWgmmaM)
                                 : mask.fully_kept(wg_row0, kWgmmaM, col0, kCols);
  if (!kept) mask.apply<kRowsAreKeys>(s, warp_row0, col0, lane, 0.0f);
}

// dp <- dP - D (D = 0 past Tq: workspace padding).
template <bool kRowsAreKeys, int kNT, bool kPairLoads = false>
__device__ __forceinline__ void dp_minus_d(float (&dp)[1][kNT][4], const float* dsum, int lane) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dp[0][nt][e] -= stat_value<kRowsAreKeys, kPairLoads>(dsum, nt, e, lane);
}

// Under softcap, one score: s <- r = 1 / (e^(2 S pre) + 1), and returns
// r - r^2, the factor of dP - D in dS / 4 (p_and_ds_factor says why).
// k = kTwoLog2e * pre.
constexpr float kTwoLog2e = 2.0f * 1.4426950408889634f;
__device__ __forceinline__ float to_softcap_r(float& s, float k) {
  const float r = fused::softcap_r(s, k);
  s = r;
  return fmaf(-r, r, r);
}

// Under softcap, a warp's whole tile: s <- r as to_softcap_r, and
// sink(nt, e, r - r^2) for each element. With kPoly (bwd_softcap_poly:
// docs/decisions/hopper-backward-softcap-poly.md) by the polynomial (no
// MUFU op) where every raw score of the warp's tile is in its range
// (softcap.cuh softcap_poly_applies, one vote; all lanes active), else by
// ex2 + rcp; without kPoly always the latter. Both give r within about
// 1e-7.
template <bool kPoly, int kNT, class Sink>
__device__ __forceinline__ void to_softcap_r_tile(float (&s)[1][kNT][4],
                                                  const fused::ScoreArgs& score, Sink&& sink) {
  if (kPoly && fused::softcap_poly_applies(s, score.poly_bound)) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float r = fused::softcap_poly_r(s[0][nt][e] * score.pre);
        s[0][nt][e] = r;
        sink(nt, e, fmaf(-r, r, r));
      }
  } else {
    const float k = kTwoLog2e * score.pre;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sink(nt, e, to_softcap_r(s[0][nt][e], k));
  }
}

// Given s = S and dp = dP - D of one step: s <- P, masked elements 0, and
// dp <- the factor of P in dS = s o dp. Without softcap P = 2^(S mult -
// lse2) and dp is left alone. Under softcap v = tanh(S pre) = 1 - 2r with
// r = 1 / (e^(2 S pre) + 1), so (before masking)
//   P = 2^(v mult - lse2) = 2^(-2 mult r + (mult - lse2)): one FMA of r,
//       the workspace holding lse2 - mult (softcap_backward_terms);
//   1 - v^2 = 4 r (1 - r): dp <- dp (r - r^2), i.e. dS / 4, which dK and
//       dQ take back with BackwardParams::dkdq_scale.
// That is 3 instructions per score fewer than forming v and 1 - v^2.
// e^(2 S pre) = +inf gives r = 0 (v = 1), 0 gives r = 1 (v = -1).
template <bool kRowsAreKeys, bool kSoftcap, bool kPolyR, int kNT>
__device__ __forceinline__ void p_and_ds_factor(float (&s)[1][kNT][4], float (&dp)[1][kNT][4],
                                                const float* lse2, const fused::ScoreArgs& score,
                                                const fused::MaskPolicy& mask, int wg_row0,
                                                int warp_row0, int col0, int lane) {
  if constexpr (kSoftcap) {
    to_softcap_r_tile<kPolyR>(s, score, [&dp](int nt, int e, float f) { dp[0][nt][e] *= f; });
    p_from_scores<kRowsAreKeys>(s, lse2, -2.0f * score.mult, mask, wg_row0, warp_row0, col0, lane);
  } else {
    p_from_scores<kRowsAreKeys>(s, lse2, score.mult, mask, wg_row0, warp_row0, col0, lane);
  }
}

// Both kernels, after a step's S and dP wgmma groups have been committed
// (two groups, S first, when kOverlapSdP; else one): waits for them and
// turns the warpgroup's accumulators into
//   s  <- P = 2^(v * mult - lse2), masked elements 0 (v = S, or
//         tanh(S * pre) under softcap),
//   dp <- dP - D, times 1 - v^2 under softcap (v before masking; as
//         p_and_ds_factor, a quarter of it).
// Orientation and indexing: stat_index, p_from_scores. Overlapped, P (and
// under softcap the factor r - r^2, in a third array) is computed between
// wait_group 1 (S has landed) and wait_group 0, while dP's wgmma still runs;
// the products are the serial order's, so the results are bitwise the same.
template <bool kRowsAreKeys, bool kSoftcap, bool kOverlapSdP, bool kPolyR, int kNT>
__device__ __forceinline__ void p_and_dp_minus_d(float (&s)[1][kNT][4], float (&dp)[1][kNT][4],
                                                 const float* lse2, const float* dsum,
                                                 const fused::ScoreArgs& score,
                                                 const fused::MaskPolicy& mask, int wg_row0,
                                                 int warp_row0, int col0, int lane) {
  if constexpr (kOverlapSdP && kSoftcap) {
    // The S group has completed; dP (not read here) may still run.
    ptx::wgmma_wait<1>();
    ptx::pin(s[0]);
    float factor[kNT][4];
    to_softcap_r_tile<kPolyR>(s, score, [&factor](int nt, int e, float f) { factor[nt][e] = f; });
    p_from_scores<kRowsAreKeys>(s, lse2, -2.0f * score.mult, mask, wg_row0, warp_row0, col0, lane);
    ptx::wgmma_wait<0>();
    ptx::pin(dp[0]);
    dp_minus_d<kRowsAreKeys>(dp, dsum, lane);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[0][nt][e] *= factor[nt][e];
  } else if constexpr (kOverlapSdP) {
    // The S group has completed; dP (not read here) may still run.
    // lse2 and D by pairs where the rows are keys (stat_value).
    ptx::wgmma_wait<1>();
    ptx::pin(s[0]);
    p_from_scores<kRowsAreKeys, kNT, kRowsAreKeys>(s, lse2, score.mult, mask, wg_row0, warp_row0,
                                                   col0, lane);
    ptx::wgmma_wait<0>();
    ptx::pin(dp[0]);
    dp_minus_d<kRowsAreKeys, kNT, kRowsAreKeys>(dp, dsum, lane);
  } else {
    ptx::wgmma_wait<0>();
    ptx::pin(s[0]);
    ptx::pin(dp[0]);
    dp_minus_d<kRowsAreKeys>(dp, dsum, lane);
    p_and_ds_factor<kRowsAreKeys, kSoftcap, kPolyR>(s, dp, lse2, score, mask, wg_row0, warp_row0,
                                                    col0, lane);
  }
}

}  // namespace gqattn::hopper::bwd
