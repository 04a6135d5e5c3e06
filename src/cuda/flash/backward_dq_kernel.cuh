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
// Warp w owns query rows [w kRowsPerWarp, (w + 1) kRowsPerWarp) as kMT m16
// tiles (d64, d128: two, so every K/V fragment read from shared memory feeds
// two mma; see DqTile); K and V tiles are double-buffered: step t+1's loads
// are issued right after the barrier that opens step t.
//
// A varlen batch (kVarlen): rows and mask of the CTA's sequence
// (fused/sequence.hpp), lse2 and D from its workspace block
// (fused::workspace_row), as in the forward kernel. A template flag here
// alone: this kernel is at the register limit, and a mask read from the
// offsets (registers) instead of the parameters (constant bank) made the
// dense instances spill in the key loop; the dense ones are the kernel as
// it was.
//
// A padded head dim (p.head_dim < kD: fused::kernel_head_dim): Q, dO, K, V
// columns from head_dim on are zero-filled in shared memory and dQ's are
// not stored (kPadded, as in the forward kernel; the padded instances are
// the varlen ones and take dense batches too: their workspace rows come
// from fused::workspace_row, which asks the batch).
#pragma once

#include <cstdint>

#include "cuda/flash/params.hpp"
#include "cuda/flash/tile_io.cuh"
#include "cuda/flash/tile_sizes.hpp"
#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/fused/sequence.hpp"
#include "cuda/fused/softcap.cuh"

namespace gqattn::flash {

template <int kD, typename Elem, bool kSoftcap, bool kVarlen, bool kPadded = false>
__global__ void __launch_bounds__(DqTile<kD>::kWarps* fused::kWarpSize)
    backward_dq_kernel(const fused::BackwardParams p) {
  using Tile = DqTile<kD>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kThreads = Tile::kWarps * fused::kWarpSize;
  constexpr int kRowsPerWarp = kBM / Tile::kWarps;
  constexpr int kMT = kRowsPerWarp / fused::kMmaM;  // m16 tiles of queries per warp
  constexpr int kNT = kBN / fused::kMmaN;           // n8 tiles of S, dP
  constexpr int kDT = kD / fused::kMmaN;            // n8 tiles of dQ
  constexpr int kStepsD = kD / fused::kMmaK;
  constexpr int kStepsN = kBN / fused::kMmaK;
  static_assert(kRowsPerWarp % fused::kMmaM == 0, "each warp owns whole m16 tiles of queries");
  static_assert(kNT % 2 == 0 && kDT % 2 == 0, "tile shape");
  static_assert(!kPadded || kVarlen, "the padded instances are the varlen ones");
  using QTile = SmemTile<kBM, kD>;
  using KVTile = SmemTile<kBN, kD>;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_addr(smem);
  const uint32_t s_do = s_q + QTile::kBytes;
  const uint32_t s_kv0 = s_do + QTile::kBytes;  // stage s: K at s_kv0 + s * kStageBytes, then V
  constexpr uint32_t kStageBytes = 2 * KVTile::kBytes;

  const int tid_ = threadIdx.x;
  const int row_w = (tid_ / fused::kWarpSize) * kRowsPerWarp;
  int tid = tid_, lane = tid_ % fused::kWarpSize;  // refreshed by opaque() every step

  // Block -> (query tile, head, batch), longest (last, under causal) first.
  const int num_bh = p.B * p.H;
  const int num_m = int(gridDim.x) / num_bh;
  const int m_block = num_m - 1 - int(blockIdx.x) / num_bh;
  const int bh = int(blockIdx.x) % num_bh;
  const int b = bh / p.H;
  const int h = bh % p.H;
  const int hk = h / (p.H / p.Hkv);

  // The grid covers the longest sequence: a varlen sequence's query tiles
  // past its own tq have nothing to do.
  // Dense (!kVarlen): no offsets, so the batch's mask and rows from 0.
  const fused::SequenceArgs seq_args = kVarlen ? p.seq : fused::SequenceArgs{};
  const fused::Sequence seq = fused::sequence_of(seq_args, p.mask, b);
  const fused::MaskPolicy mask(seq.mask);
  const int m0 = m_block * kBM;
  if (kVarlen && m0 >= mask.tq) return;
  const int rows = min(kBM, mask.tq - m0);
  const fused::BlockRange range = mask.key_blocks(m0, rows, kBN);
  const Elem* k = static_cast<const Elem*>(p.k) + b * p.k_stride.batch +
                  int64_t(seq.k_row0) * p.k_stride.row + hk * p.k_stride.head;
  const Elem* v = static_cast<const Elem*>(p.v) + b * p.v_stride.batch +
                  int64_t(seq.k_row0) * p.v_stride.row + hk * p.v_stride.head;
  const int64_t q_row0 = int64_t(seq.q_row0) + m0;  // the tile's first row of q, do
  // The tensors' columns: all kD but in the padded instances.
  const ColumnBound<kPadded> cols{kPadded ? p.head_dim : kD};

  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBN;
    const uint32_t s_k = s_kv0 + stage * kStageBytes;
    load_tile_async<kBN, kD, kThreads>(s_k, k + int64_t(n0) * p.k_stride.row, p.k_stride.row,
                                       mask.tk - n0, cols, tid);
    load_tile_async<kBN, kD, kThreads>(s_k + KVTile::kBytes, v + int64_t(n0) * p.v_stride.row,
                                       p.v_stride.row, mask.tk - n0, cols, tid);
  };

  if (range.last >= range.first) {
    const Elem* q = static_cast<const Elem*>(p.q) + b * p.q_stride.batch + q_row0 * p.q_stride.row +
                    h * p.q_stride.head;
    const Elem* d_o = static_cast<const Elem*>(p.dout) + b * p.do_stride.batch +
                      q_row0 * p.do_stride.row + h * p.do_stride.head;
    load_tile_async<kBM, kD, kThreads>(s_q, q, p.q_stride.row, rows, cols, tid);
    load_tile_async<kBM, kD, kThreads>(s_do, d_o, p.do_stride.row, rows, cols, tid);
    load_kv(range.last, 0);
  }
  cp_async_commit();

  // lse2 and D of this thread's rows: g and g + 8 of each of the warp's m16
  // tiles (index 2 mt + half; the workspace rows are padded to whole tiles).
  const int64_t ws_row = (kVarlen ? fused::workspace_row(p, b, h, seq.ws_row0)
                                  : (int64_t(b) * p.H + h) * p.tq_padded) +
                         m0 + row_w + fused::frag_row(lane);
  float lse2[2 * kMT], dsum[2 * kMT];
#pragma unroll
  for (int r = 0; r < 2 * kMT; ++r) {
    const int64_t row = ws_row + (r / 2) * fused::kMmaM + (r % 2) * fused::kFragRowHalf;
    lse2[r] = p.lse2[row];
    dsum[r] = p.dsum[row];
  }

  float acc_dq[kMT][kDT][4] = {};

  for (int n_block = range.last, t = 0; n_block >= range.first; --n_block, ++t) {
    const int n0 = n_block * kBN;
    const uint32_t s_k = s_kv0 + (t % kKeyStages) * kStageBytes;
    const uint32_t s_v = s_k + KVTile::kBytes;

    tid = fused::opaque(tid_);
    lane = fused::opaque(tid_ % fused::kWarpSize);
    cp_async_wait<0>();
    __syncthreads();
    if (n_block > range.first) load_kv(n_block - 1, (t + 1) % kKeyStages);
    cp_async_commit();

    float dp[kMT][kNT][4] = {};
    float s[kMT][kNT][4] = {};
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk) {
      uint32_t a_do[kMT][4], a_q[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        load_a<QTile>(a_do[mt], s_do, row_w + mt * fused::kMmaM, kk, lane);
        load_a<QTile>(a_q[mt], s_q, row_w + mt * fused::kMmaM, kk, lane);
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bf[4];
        load_b<KVTile>(bf, s_v, np * 2 * fused::kMmaN, kk, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          fused::mma_16816<Elem>(dp[mt][2 * np], a_do[mt], bf[0], bf[1]);
          fused::mma_16816<Elem>(dp[mt][2 * np + 1], a_do[mt], bf[2], bf[3]);
        }
        load_b<KVTile>(bf, s_k, np * 2 * fused::kMmaN, kk, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          fused::mma_16816<Elem>(s[mt][2 * np], a_q[mt], bf[0], bf[1]);
          fused::mma_16816<Elem>(s[mt][2 * np + 1], a_q[mt], bf[2], bf[3]);
        }
      }
    }

    // s <- P, dp <- (dP - D) [* (1 - v^2)], computed before masking (v of a
    // masked element may be anything finite; its P is then set to 0).
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 2 * mt + e / 2;
          float val = s[mt][nt][e];
          float dpd = dp[mt][nt][e] - dsum[r];
          if constexpr (kSoftcap) {
            val = fused::softcap_tanh(val * p.score.pre);
            dpd *= 1.0f - val * val;
          }
          s[mt][nt][e] = fused::fast_exp2(fmaf(val, p.score.mult, -lse2[r]));
          dp[mt][nt][e] = dpd;
        }
    if (!mask.fully_kept(m0, kBM, n0, kBN))
      mask.apply</*kRowsAreKeys=*/false>(s, m0 + row_w, n0, lane, 0.0f);

      // dQ += dS K, dS = P * dp straight from the accumulators.
#pragma unroll
    for (int kk = 0; kk < kStepsN; ++kk) {
      uint32_t a_ds[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const float(&s0)[4] = s[mt][2 * kk];
        const float(&s1)[4] = s[mt][2 * kk + 1];
        const float(&d0)[4] = dp[mt][2 * kk];
        const float(&d1)[4] = dp[mt][2 * kk + 1];
        a_ds[mt][0] = fused::pack2<Elem>(s0[0] * d0[0], s0[1] * d0[1]);
        a_ds[mt][1] = fused::pack2<Elem>(s0[2] * d0[2], s0[3] * d0[3]);
        a_ds[mt][2] = fused::pack2<Elem>(s1[0] * d1[0], s1[1] * d1[1]);
        a_ds[mt][3] = fused::pack2<Elem>(s1[2] * d1[2], s1[3] * d1[3]);
      }
#pragma unroll
      for (int dn = 0; dn < kDT / 2; ++dn) {
        uint32_t bf[4];
        load_b_trans<KVTile>(bf, s_k, dn * 2 * fused::kMmaN, kk, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          fused::mma_16816<Elem>(acc_dq[mt][2 * dn], a_ds[mt], bf[0], bf[1]);
          fused::mma_16816<Elem>(acc_dq[mt][2 * dn + 1], a_ds[mt], bf[2], bf[3]);
        }
      }
    }
  }

  // Epilogue: dQ times the scale, through the Q tile's space.
  tid = tid_;
  lane = tid_ % fused::kWarpSize;
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      store_acc_frag<QTile, Elem>(smem, acc_dq[mt][dt], row_w + mt * fused::kMmaM,
                                  dt * fused::kMmaN, p.score.scale, lane);
  __syncthreads();
  // The sequence's first row read again rather than held through the key
  // loop (one register fewer there, where the kernel is at its limit).
  const int dq_row0 = fused::sequence_of(seq_args, p.mask, b).q_row0;
  Elem* dq = static_cast<Elem*>(p.dq) + b * p.dq_stride.batch +
             (int64_t(dq_row0) + m0) * p.dq_stride.row + h * p.dq_stride.head;
  store_tile<kBM, kD, kThreads>(smem, dq, p.dq_stride.row, rows, cols, tid);
}

}  // namespace gqattn::flash
