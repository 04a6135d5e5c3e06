// cuda-flash: the fused forward kernel, FlashAttention-2 style on mma.sync:
// one CTA per (query tile, head, batch), S = Q K^T and O += P V on tensor
// cores, online softmax in registers, P never leaves the registers. Checked
// against the f64 oracle by tests/gpu/test_flash_*.cpp.
//
// Per CTA: kBlockM query rows of head h; warp w owns rows
// [w * kRowsPerWarp, (w + 1) * kRowsPerWarp) as kMT m16 tiles. The key tiles
// the mask policy says this query tile visits are walked from the last to
// the first (the diagonal and the Tk edge, which need element masking, come
// first under a causal mask). Shared memory holds Q, one K tile and one V
// tile; loads are staggered so that they overlap the math:
//   top of step n:  wait K(n); barrier; issue V(n)
//   S = Q K(n)^T;   (softcap; mask if the tile is not fully kept)
//   wait V(n); barrier (everyone is done with K(n)); issue K(n-1)
//   online softmax; O += P V(n)
// O is rescaled by the change of the row max at each step and divided by
// the row sum once at the end (under ScoreMode::softcap_without_row_max,
// score_mode.hpp: never rescaled, and divided by the row sums of the 16-bit
// P, formed by one more mma per k-step against ones); the epilogue stages O
// through shared memory so the global stores are whole 16-byte chunks.
//
// A varlen batch (fused/sequence.hpp): the CTA's sequence b gives its rows
// (q, o, lse from q_row0, k, v from k_row0) and its mask, whose tq, tk bound
// every load and store as Tq, Tk do in a dense batch; rows of the
// neighbouring sequences are never loaded (zero-filled) nor stored. A
// template flag (kVarlen), as in the backward kernels: the dense instances
// stay the kernel they were (their registers are at the limit).
//
// A padded head dim (p.head_dim < kD, a multiple of 8: fused::kernel_head_dim):
// Q, K, V columns from head_dim on are zero-filled in shared memory (they
// add nothing to q.k, and P V gives 0 there) and O's are not stored. Another
// template flag (kPadded), so that the instances of the kernels' own head
// dims compile exactly as without it (a runtime column bound in every
// instance cost the d128 loop registers and spills on sm_80:
// docs/decisions/flash-padded-head-dims.md). The padded instances are also
// the varlen ones (kVarlen), which take a dense batch too (its sequence is
// the batch's): one padded instance per element type and score mode.
#pragma once

#include <cstdint>

#include "cuda/flash/params.hpp"
#include "cuda/flash/tile_io.cuh"
#include "cuda/flash/tile_sizes.hpp"
#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/fused/score_mode.hpp"
#include "cuda/fused/sequence.hpp"
#include "cuda/fused/softcap.cuh"
#include "cuda/fused/softmax.cuh"

namespace gqattn::flash {

// kVarlen: a varlen batch (see above), launched only for one, or a padded
// head dim; the dense instances read the batch's mask from the parameters
// (constant bank). kPadded: a head dim below kD (see above).
template <int kD, typename Elem, fused::ScoreMode kScores, bool kVarlen = false,
          bool kPadded = false>
__global__ void __launch_bounds__(ForwardTile<kD>::kWarps* fused::kWarpSize)
    forward_kernel(const ForwardParams p) {
  constexpr bool kRowMax = kScores != fused::ScoreMode::softcap_without_row_max;
  using Tile = ForwardTile<kD>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kThreads = Tile::kWarps * fused::kWarpSize;
  constexpr int kRowsPerWarp = kBM / Tile::kWarps;
  constexpr int kMT = kRowsPerWarp / fused::kMmaM;  // m16 tiles per warp
  constexpr int kNT = kBN / fused::kMmaN;           // n8 tiles of S
  constexpr int kDT = kD / fused::kMmaN;            // n8 tiles of O
  constexpr int kStepsQK = kD / fused::kMmaK;
  constexpr int kStepsPV = kBN / fused::kMmaK;
  static_assert(kRowsPerWarp % fused::kMmaM == 0 && kNT % 2 == 0 && kDT % 2 == 0, "tile shape");
  static_assert(!kPadded || kVarlen, "the padded instances are the varlen ones");
  using QTile = SmemTile<kBM, kD>;
  using KVTile = SmemTile<kBN, kD>;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_addr(smem);
  const uint32_t s_k = s_q + QTile::kBytes;
  const uint32_t s_v = s_k + KVTile::kBytes;

  const int tid_ = threadIdx.x;
  const int row_w = (tid_ / fused::kWarpSize) * kRowsPerWarp;  // this warp's first row in the tile

  // Block -> (query tile, head, batch): the last query tiles, which visit
  // the most keys under a causal mask, are scheduled first.
  const int num_bh = p.B * p.H;
  const int num_m = int(gridDim.x) / num_bh;
  const int m_block = num_m - 1 - int(blockIdx.x) / num_bh;
  const int bh = int(blockIdx.x) % num_bh;
  const int b = bh / p.H;
  const int h = bh % p.H;
  const int hk = h / (p.H / p.Hkv);

  // Sequence b's rows and mask (fused/sequence.hpp; a dense batch's rows
  // start at 0). The grid covers the longest sequence: a varlen sequence's
  // query tiles past its own tq have nothing to do.
  const fused::Sequence seq =
      fused::sequence_of(kVarlen ? p.seq : fused::SequenceArgs{}, p.mask, b);
  const fused::MaskPolicy mask(seq.mask);
  const int m0 = m_block * kBM;
  if (kVarlen && m0 >= mask.tq) return;
  const int rows = min(kBM, mask.tq - m0);
  const Elem* q = static_cast<const Elem*>(p.q) + b * p.q_stride.batch +
                  (int64_t(seq.q_row0) + m0) * p.q_stride.row + h * p.q_stride.head;
  const Elem* k = static_cast<const Elem*>(p.k) + b * p.k_stride.batch +
                  int64_t(seq.k_row0) * p.k_stride.row + hk * p.k_stride.head;
  const Elem* v = static_cast<const Elem*>(p.v) + b * p.v_stride.batch +
                  int64_t(seq.k_row0) * p.v_stride.row + hk * p.v_stride.head;
  const fused::BlockRange range = mask.key_blocks(m0, rows, kBN);
  // The tensors' columns: all kD but in the padded instances.
  const ColumnBound<kPadded> cols{kPadded ? p.head_dim : kD};

  int tid = tid_, lane = tid_ % fused::kWarpSize;  // refreshed by opaque() every step
  auto load_k = [&](int n_block) {
    const int n0 = n_block * kBN;
    load_tile_async<kBN, kD, kThreads>(s_k, k + int64_t(n0) * p.k_stride.row, p.k_stride.row,
                                       mask.tk - n0, cols, tid);
  };
  auto load_v = [&](int n_block) {
    const int n0 = n_block * kBN;
    load_tile_async<kBN, kD, kThreads>(s_v, v + int64_t(n0) * p.v_stride.row, p.v_stride.row,
                                       mask.tk - n0, cols, tid);
  };

  load_tile_async<kBM, kD, kThreads>(s_q, q, p.q_stride.row, rows, cols, tid);
  if (range.last >= range.first) load_k(range.last);
  cp_async_commit();

  float acc_o[kMT][kDT][4] = {};
  // Without row max, o is normalised by the row sums of the 16-bit P its
  // numerator used (score_mode.hpp, OnlineSoftmax::finalize_unshifted): P
  // times ones on the tensor cores, every column of p_sums the row sum.
  float p_sums[kMT][4] = {};
  const uint32_t ones = fused::pack2<Elem>(1.0f, 1.0f);
  fused::OnlineSoftmax<kMT> softmax(p.score.mult);
  if constexpr (!kRowMax) softmax.start_unshifted();

  for (int n_block = range.last; n_block >= range.first; --n_block) {
    const int n0 = n_block * kBN;
    tid = fused::opaque(tid_);
    lane = fused::opaque(tid_ % fused::kWarpSize);
    cp_async_wait<0>();
    __syncthreads();
    load_v(n_block);
    cp_async_commit();

    float s[kMT][kNT][4] = {};
#pragma unroll
    for (int kk = 0; kk < kStepsQK; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        load_a<QTile>(a[mt], s_q, row_w + mt * fused::kMmaM, kk, lane);
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bk[4];
        load_b<KVTile>(bk, s_k, np * 2 * fused::kMmaN, kk, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          fused::mma_16816<Elem>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          fused::mma_16816<Elem>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
    if constexpr (kScores == fused::ScoreMode::softcap) fused::apply_softcap(s, p.score.pre);
    if constexpr (!kRowMax) fused::softcap_exponents(s, p.score.pre, p.score.mult);  // s: v mult
    if (!mask.fully_kept(m0, kBM, n0, kBN))
      mask.apply</*kRowsAreKeys=*/false>(s, m0 + row_w, n0, lane, -INFINITY);

    cp_async_wait<0>();
    __syncthreads();
    if (n_block > range.first) load_k(n_block - 1);
    cp_async_commit();

    // O rescaled at every key tile, not lazily:
    // docs/decisions/flash-forward-lazy-rescale.md.
    if constexpr (kRowMax)
      softmax.template update</*kLazy=*/false>(s, acc_o);
    else
      softmax.update_unshifted(s);

#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        fused::acc_to_a<Elem>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
      if constexpr (!kRowMax) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) fused::mma_16816<Elem>(p_sums[mt], a[mt], ones, ones);
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t bv[4];
        load_b_trans<KVTile>(bv, s_v, dp * 2 * fused::kMmaN, kk, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          fused::mma_16816<Elem>(acc_o[mt][2 * dp], a[mt], bv[0], bv[1]);
          fused::mma_16816<Elem>(acc_o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }

  float lse[2 * kMT];
  if constexpr (kRowMax)
    softmax.finalize(acc_o, lse);
  else
    softmax.finalize_unshifted(acc_o, lse, p_sums);
  tid = tid_;
  lane = tid_ % fused::kWarpSize;

  // Epilogue: O through shared memory (the Q tile's space) to whole-chunk stores.
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      store_acc_frag<QTile, Elem>(smem, acc_o[mt][dt], row_w + mt * fused::kMmaM, dt * fused::kMmaN,
                                  1.0f, lane);
  __syncthreads();
  Elem* o = static_cast<Elem*>(p.o) + b * p.o_stride.batch +
            (int64_t(seq.q_row0) + m0) * p.o_stride.row + h * p.o_stride.head;
  store_tile<kBM, kD, kThreads>(smem, o, p.o_stride.row, rows, cols, tid);

  if (p.lse != nullptr && lane % 4 == 0) {
    float* lse_row = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0;
#pragma unroll
    for (int r = 0; r < 2 * kMT; ++r) {
      const int row = m0 + row_w + (r / 2) * fused::kMmaM + (r % 2) * fused::kFragRowHalf +
                      fused::frag_row(lane);
      if (row < mask.tq) lse_row[row] = lse[r];
    }
  }
}

}  // namespace gqattn::flash
