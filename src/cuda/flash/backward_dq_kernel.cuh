// cuda-flash: the backward's dQ kernel. One CTA per (query tile, head,
// batch) walks the key tiles the mask policy says the tile visits and
// recomputes S and dP there:
//   dP = dO V^T,  S = Q K^T,  P = 2^(v * mult - lse2),
//   dS = P o (dP - D) [o (1 - v^2) under softcap],  dQ += dS K
// and writes dQ (times the softmax scale) once. Checked against the f64
// oracle by tests/gpu/test_flash_*.cpp.
//
// Why a separate kernel: it makes dQ deterministic (the same bits on every
// run) with no atomics, no per-split slabs and no workspace beyond O(B H Tq),
// and keeps dS in registers (it is the A operand of dQ += dS K as it comes
// out of the accumulator). The price is recomputing S and dP: 7 GEMMs per
// tile pair instead of FlashAttention-2's 5 (dQ by atomicAdd from the dK/dV
// kernel, non-deterministic) — about 1.4x the backward's FLOPs.
//
// Warp w owns query rows [16 w, 16 w + 16); K and V tiles are
// double-buffered: step t+1's loads are issued right after the barrier that
// opens step t.
#pragma once

#include <cstdint>

#include "cuda/flash/mask.cuh"
#include "cuda/flash/mma.cuh"
#include "cuda/flash/params.hpp"
#include "cuda/flash/tile_io.cuh"
#include "cuda/flash/tile_sizes.hpp"

namespace gqattn::flash {

template <int kD, typename Elem, bool kSoftcap>
__global__ void __launch_bounds__(DqTile<kD>::kWarps* kWarpSize)
    backward_dq_kernel(const BackwardParams p) {
  using Tile = DqTile<kD>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kThreads = Tile::kWarps * kWarpSize;
  constexpr int kNT = kBN / kMmaN;  // n8 tiles of S, dP
  constexpr int kDT = kD / kMmaN;   // n8 tiles of dQ
  constexpr int kStepsD = kD / kMmaK;
  constexpr int kStepsN = kBN / kMmaK;
  static_assert(kBM == Tile::kWarps * kMmaM, "each warp owns one m16 tile of queries");
  static_assert(kNT % 2 == 0 && kDT % 2 == 0, "tile shape");
  using QTile = SmemTile<kBM, kD>;
  using KVTile = SmemTile<kBN, kD>;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_addr(smem);
  const uint32_t s_do = s_q + QTile::kBytes;
  const uint32_t s_kv0 = s_do + QTile::kBytes;  // stage s: K at s_kv0 + s * kStageBytes, then V
  constexpr uint32_t kStageBytes = 2 * KVTile::kBytes;

  const int tid_ = threadIdx.x;
  const int row_w = (tid_ / kWarpSize) * kMmaM;
  int tid = tid_, lane = tid_ % kWarpSize;  // refreshed by opaque() every step

  // Block -> (query tile, head, batch), longest (last, under causal) first.
  const int num_bh = p.B * p.H;
  const int num_m = int(gridDim.x) / num_bh;
  const int m_block = num_m - 1 - int(blockIdx.x) / num_bh;
  const int bh = int(blockIdx.x) % num_bh;
  const int b = bh / p.H;
  const int h = bh % p.H;
  const int hk = h / (p.H / p.Hkv);

  const MaskPolicy mask(p.mask);
  const int m0 = m_block * kBM;
  const int rows = min(kBM, mask.tq - m0);
  const BlockRange range = mask.key_blocks(m0, rows, kBN);
  const Elem* k = static_cast<const Elem*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const Elem* v = static_cast<const Elem*>(p.v) + b * p.v_stride.batch + hk * p.v_stride.head;

  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBN;
    const uint32_t s_k = s_kv0 + stage * kStageBytes;
    load_tile_async<kBN, kD, kThreads>(s_k, k + int64_t(n0) * p.k_stride.row, p.k_stride.row,
                                       mask.tk - n0, tid);
    load_tile_async<kBN, kD, kThreads>(s_k + KVTile::kBytes, v + int64_t(n0) * p.v_stride.row,
                                       p.v_stride.row, mask.tk - n0, tid);
  };

  if (range.last >= range.first) {
    const Elem* q = static_cast<const Elem*>(p.q) + b * p.q_stride.batch +
                    int64_t(m0) * p.q_stride.row + h * p.q_stride.head;
    const Elem* d_o = static_cast<const Elem*>(p.dout) + b * p.do_stride.batch +
                      int64_t(m0) * p.do_stride.row + h * p.do_stride.head;
    load_tile_async<kBM, kD, kThreads>(s_q, q, p.q_stride.row, rows, tid);
    load_tile_async<kBM, kD, kThreads>(s_do, d_o, p.do_stride.row, rows, tid);
    load_kv(range.last, 0);
  }
  cp_async_commit();

  // lse2 and D of this thread's two rows (g and g + 8 of the warp's tile).
  const int64_t ws_row = (int64_t(b) * p.H + h) * p.tq_padded + m0 + row_w + frag_row(lane);
  const float lse2[2] = {p.lse2[ws_row], p.lse2[ws_row + kFragRowHalf]};
  const float dsum[2] = {p.dsum[ws_row], p.dsum[ws_row + kFragRowHalf]};

  float acc_dq[kDT][4] = {};

  for (int n_block = range.last, t = 0; n_block >= range.first; --n_block, ++t) {
    const int n0 = n_block * kBN;
    const uint32_t s_k = s_kv0 + (t % kKeyStages) * kStageBytes;
    const uint32_t s_v = s_k + KVTile::kBytes;

    tid = opaque(tid_);
    lane = opaque(tid_ % kWarpSize);
    cp_async_wait<0>();
    __syncthreads();
    if (n_block > range.first) load_kv(n_block - 1, (t + 1) % kKeyStages);
    cp_async_commit();

    float dp[kNT][4] = {};
    float s_tiles[1][kNT][4] = {};  // one m16 tile: the mask policy's shape
    float(&s)[kNT][4] = s_tiles[0];
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk) {
      uint32_t a_do[4], a_q[4];
      load_a<QTile>(a_do, s_do, row_w, kk, lane);
      load_a<QTile>(a_q, s_q, row_w, kk, lane);
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bf[4];
        load_b<KVTile>(bf, s_v, np * 2 * kMmaN, kk, lane);
        mma_16816<Elem>(dp[2 * np], a_do, bf[0], bf[1]);
        mma_16816<Elem>(dp[2 * np + 1], a_do, bf[2], bf[3]);
        load_b<KVTile>(bf, s_k, np * 2 * kMmaN, kk, lane);
        mma_16816<Elem>(s[2 * np], a_q, bf[0], bf[1]);
        mma_16816<Elem>(s[2 * np + 1], a_q, bf[2], bf[3]);
      }
    }

    // s <- P, dp <- (dP - D) [* (1 - v^2)], computed before masking (v of a
    // masked element may be anything finite; its P is then set to 0).
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        float val = s[nt][e];
        float dpd = dp[nt][e] - dsum[r];
        if constexpr (kSoftcap) {
          val = softcap_tanh(val * p.score.pre);
          dpd *= 1.0f - val * val;
        }
        s[nt][e] = fast_exp2(fmaf(val, p.score.mult, -lse2[r]));
        dp[nt][e] = dpd;
      }
    if (!mask.fully_kept(m0, kBM, n0, kBN))
      mask.apply</*kRowsAreKeys=*/false>(s_tiles, m0 + row_w, n0, lane, 0.0f);

      // dQ += dS K, dS = P * dp straight from the accumulators.
#pragma unroll
    for (int kk = 0; kk < kStepsN; ++kk) {
      const float(&s0)[4] = s[2 * kk];
      const float(&s1)[4] = s[2 * kk + 1];
      const float(&d0)[4] = dp[2 * kk];
      const float(&d1)[4] = dp[2 * kk + 1];
      uint32_t a_ds[4];
      a_ds[0] = pack2<Elem>(s0[0] * d0[0], s0[1] * d0[1]);
      a_ds[1] = pack2<Elem>(s0[2] * d0[2], s0[3] * d0[3]);
      a_ds[2] = pack2<Elem>(s1[0] * d1[0], s1[1] * d1[1]);
      a_ds[3] = pack2<Elem>(s1[2] * d1[2], s1[3] * d1[3]);
#pragma unroll
      for (int dn = 0; dn < kDT / 2; ++dn) {
        uint32_t bf[4];
        load_b_trans<KVTile>(bf, s_k, dn * 2 * kMmaN, kk, lane);
        mma_16816<Elem>(acc_dq[2 * dn], a_ds, bf[0], bf[1]);
        mma_16816<Elem>(acc_dq[2 * dn + 1], a_ds, bf[2], bf[3]);
      }
    }
  }

  // Epilogue: dQ times the scale, through the Q tile's space.
  tid = tid_;
  lane = tid_ % kWarpSize;
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
    store_acc_frag<QTile, Elem>(smem, acc_dq[dt], row_w, dt * kMmaN, p.score.scale, lane);
  __syncthreads();
  Elem* dq = static_cast<Elem*>(p.dq) + b * p.dq_stride.batch + int64_t(m0) * p.dq_stride.row +
             h * p.dq_stride.head;
  store_tile<kBM, kD, kThreads>(smem, dq, p.dq_stride.row, rows, tid);
}

}  // namespace gqattn::flash
