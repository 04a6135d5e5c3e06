// The fused KV-cache path's attention kernel: split-KV attention of Tq
// queries per sequence over its cached keys, read straight from the pages
// (any page size: every key row is addressed through the block table), on
// mma.sync (sm80 and up). Checked against the f64 oracle by
// tests/gpu/test_kv_cache.cpp (page sizes 1, 3, 16, 256, dense caches with
// and without cache_batch_idx, decoding and chunks, GQA and MQA, causal,
// window, softcap, padded head dims, batch invariance, unchecked bad
// tables under memcheck).
//
// One CTA per (row tile, split; kv head; sequence). Its rows are packed
// (query, head of the group) pairs (plan.hpp), so each key tile is read
// once for all the query heads that use it; decoding fills an m16 tile
// with the group's heads instead of one query. The four warps share a
// CTA's work: kWarpsM of them along the rows (16 each), the other 4 /
// kWarpsM along the keys (each a slice of every key tile, its own online
// softmax): 4 x 1 for chunks of 64 rows, 2 x 2 for 32, 1 x 4 for
// decoding's 16 (plan.hpp). Key tiles stream
// through a two-stage cp.async ring:
//   prologue: Q, tiles begin and begin + 1 in flight
//   tile t:   wait for it; S = Q K^T (softcap, mask); online softmax;
//             O += P V; barrier; load tile t + 2 into its stage
// The epilogue stages every warp's normalised O and lse through shared
// memory and merges the warps of a row (the split-KV formula, in warp
// order, so the result is deterministic) into o, lse, or with several
// splits into the f32 partials the combine kernel reduces.
//
// Invariants: a key position is loaded only if it is below the sequence's
// key count (else zero-filled), a column only below head_dim; a row's kept
// keys are one interval [lo, hi] (fused/mask.cuh's rule with the query
// offset of its sequence); the split of a CTA's key tiles depends on the
// batch only through num_splits, and not at all with tiles_per_split (the
// runs of Options::batch_invariant, and of large batches).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/flash/tile_io.cuh"
#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/fused/sequence.hpp"
#include "cuda/fused/softcap.cuh"
#include "cuda/fused/softmax.cuh"
#include "cuda/kv_cache/page_rows.cuh"
#include "cuda/kv_cache/params.hpp"
#include "cuda/kv_cache/plan.hpp"

namespace gqattn::kv_cache {

// Staged O rows in the epilogue: padded against bank conflicts.
template <int kD>
constexpr int staged_row_floats() {
  return kD + 4;
}

template <int kD, typename Elem, bool kSoftcap, int kWarpsM>
__global__ void __launch_bounds__(kWarps* fused::kWarpSize) attend_kernel(const Params p) {
  constexpr int kThreads = kWarps * fused::kWarpSize;
  constexpr int kWarpsN = kWarps / kWarpsM;
  constexpr int kBM = kWarpsM * kRowsPerWarp;
  constexpr int kKeysPerWarp = kBlockN / kWarpsN;
  constexpr int kNT = kKeysPerWarp / fused::kMmaN;  // n8 tiles of a warp's S
  constexpr int kDT = kD / fused::kMmaN;            // n8 tiles of O
  constexpr int kStepsQK = kD / fused::kMmaK;
  constexpr int kStepsPV = kKeysPerWarp / fused::kMmaK;
  static_assert(kNT % 2 == 0 && kDT % 2 == 0 && kStepsPV >= 1, "tile shape");
  using QTile = flash::SmemTile<kBM, kD>;
  using KVTile = flash::SmemTile<kBlockN, kD>;
  constexpr int kStaged = staged_row_floats<kD>();
  static_assert(kWarpsN * kBM * kStaged * 4 <= kStages * 2 * KVTile::kBytes,
                "the staged O fits the key and value stages");

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = flash::smem_addr(smem);
  const uint32_t s_kv = s_q + QTile::kBytes;
  float* s_lse = reinterpret_cast<float*>(smem + QTile::kBytes + kStages * 2 * KVTile::kBytes);

  const int tid = int(threadIdx.x);
  const int lane = tid % fused::kWarpSize;
  const int warp = tid / fused::kWarpSize;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  const int group = p.H / p.Hkv;
  const int rows_total = p.Tq * group;
  const int m_tiles = (rows_total + kBM - 1) / kBM;
  const int m_tile = int(blockIdx.x) % m_tiles;
  const int split = int(blockIdx.x) / m_tiles;
  const int hk = int(blockIdx.y);
  const int b = int(blockIdx.z);
  const int m0 = m_tile * kBM;

  // Sequence b: its keys (clamped, page_rows.cuh) and mask.
  const SequenceCache seq = sequence_cache(p.cache, p.t_new, b);
  fused::MaskArgs args;
  args.tq = p.Tq;
  args.tk = seq.keys;
  args.off = p.q_start_given ? p.q_start : seq.keys - p.Tq;
  args.window = fused::sequence_window(p.window, args.off, p.Tq);
  args.causal = p.causal;
  const fused::MaskPolicy mask(args);

  // The key tiles of this CTA's queries, then this split's share of them.
  const int q_first = m0 / group;
  const int q_last = min(p.Tq - 1, (m0 + kBM - 1) / group);
  int t_first = 0, t_last = -1;
  if (mask.key_hi(q_last) >= mask.key_lo(q_first)) {
    t_first = mask.key_lo(q_first) / kBlockN;
    t_last = mask.key_hi(q_last) / kBlockN;
  }
  const int count = t_last - t_first + 1;
  const int per =
      p.tiles_per_split > 0 ? p.tiles_per_split : (count + p.num_splits - 1) / p.num_splits;
  const int begin = t_first + split * per;
  const int end = min(t_last, begin + per - 1);

  // This thread's two rows (g and g + 8 of its warp's m16 tile): their
  // kept keys [lo, hi]; a row past the packed rows keeps none.
  int lo[2], hi[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = m0 + wm * kRowsPerWarp + fused::frag_row(lane) + half * fused::kFragRowHalf;
    const int i = row / group;
    lo[half] = mask.key_lo(i);
    hi[half] = row < rows_total ? mask.key_hi(i) : -1;
  }

  const Elem* q = static_cast<const Elem*>(p.q) + b * p.q_stride.batch;
  {
    constexpr int kChunks = kBM * QTile::kChunksPerRow;
    for (int c = tid; c < kChunks; c += kThreads) {
      const int r = c / QTile::kChunksPerRow, chunk = c % QTile::kChunksPerRow;
      const int row = m0 + r;
      const bool valid = row < rows_total && chunk * fused::kElemsPerChunk < p.head_dim;
      const int i = valid ? row / group : 0;
      const int h = hk * group + (valid ? row % group : 0);
      flash::cp_async_16(
          s_q + QTile::offset(r, chunk),
          q + int64_t(i) * p.q_stride.row + h * p.q_stride.head + chunk * fused::kElemsPerChunk,
          valid);
    }
  }

  const Elem* k_head = static_cast<const Elem*>(p.cache.k) + hk * p.cache.k_stride.head;
  const Elem* v_head = static_cast<const Elem*>(p.cache.v) + hk * p.cache.v_stride.head;
  // Thread tid loads chunk tid % kChunksPerRow of rows tid / kChunksPerRow +
  // kRowsPerPass * it of a key tile, each row through the block table.
  auto load_kv = [&](int tile, int stage) {
    constexpr int kCPR = KVTile::kChunksPerRow;
    constexpr int kRowsPerPass = kThreads / kCPR;
    static_assert(kThreads % kCPR == 0 && kBlockN % kRowsPerPass == 0, "whole rows per pass");
    const uint32_t s_k = s_kv + uint32_t(stage * 2 * KVTile::kBytes);
    const uint32_t s_v = s_k + uint32_t(KVTile::kBytes);
    const int row0 = tid / kCPR, chunk = tid % kCPR;
    const int col = chunk * fused::kElemsPerChunk;
    const bool col_valid = col < p.head_dim;
#pragma unroll
    for (int it = 0; it < kBlockN / kRowsPerPass; ++it) {
      const int row = row0 + it * kRowsPerPass;
      const int pos = tile * kBlockN + row;
      const bool valid = col_valid && pos < seq.keys;
      // An invalid chunk reads nothing (zero fill); position 0 keeps its
      // table lookup inside the sequence's row of the table.
      const SequenceCache::Slot at = seq.slot(valid ? pos : 0);
      flash::cp_async_16(s_k + KVTile::offset(row, chunk),
                         k_head + SequenceCache::offset(at, p.cache.k_stride) + col, valid);
      flash::cp_async_16(s_v + KVTile::offset(row, chunk),
                         v_head + SequenceCache::offset(at, p.cache.v_stride) + col, valid);
    }
  };

  if (begin <= end) load_kv(begin, 0);
  flash::cp_async_commit();  // with Q
  if (begin + 1 <= end) load_kv(begin + 1, 1);
  flash::cp_async_commit();

  float acc_o[1][kDT][4] = {};
  fused::OnlineSoftmax<1> softmax(p.score.mult);
  const int row_w = wm * kRowsPerWarp;
  for (int t = begin; t <= end; ++t) {
    const int stage = (t - begin) & 1;
    const uint32_t s_k = s_kv + uint32_t(stage * 2 * KVTile::kBytes);
    const uint32_t s_v = s_k + uint32_t(KVTile::kBytes);
    flash::cp_async_wait<1>();  // every group but the newest: tile t's
    __syncthreads();

    float s[1][kNT][4] = {};
#pragma unroll
    for (int kk = 0; kk < kStepsQK; ++kk) {
      uint32_t a[4];
      flash::load_a<QTile>(a, s_q, row_w, kk, lane);
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bk[4];
        flash::load_b<KVTile>(bk, s_k, wn * kKeysPerWarp + np * 2 * fused::kMmaN, kk, lane);
        fused::mma_16816<Elem>(s[0][2 * np], a, bk[0], bk[1]);
        fused::mma_16816<Elem>(s[0][2 * np + 1], a, bk[2], bk[3]);
      }
    }
    if constexpr (kSoftcap) fused::apply_softcap(s, p.score.pre);
    const int col0 = t * kBlockN + wn * kKeysPerWarp;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + nt * fused::kMmaN + fused::frag_col(lane) + e;
          float& x = s[0][nt][2 * half + e];
          x = (col >= lo[half]) & (col <= hi[half]) ? x : -INFINITY;
        }
    softmax.template update</*kLazy=*/false>(s, acc_o);

#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk) {
      uint32_t a[4];
      fused::acc_to_a<Elem>(a, s[0][2 * kk], s[0][2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t bv[4];
        flash::load_b_trans<KVTile>(bv, s_v, dp * 2 * fused::kMmaN, wn * kStepsPV + kk, lane);
        fused::mma_16816<Elem>(acc_o[0][2 * dp], a, bv[0], bv[1]);
        fused::mma_16816<Elem>(acc_o[0][2 * dp + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage
    if (t + 2 <= end) load_kv(t + 2, stage);
    flash::cp_async_commit();
  }

  float lse[2];
  softmax.finalize(acc_o, lse);

  // Epilogue: every warp's O (normalised) and lse through shared memory.
  flash::cp_async_wait<0>();
  __syncthreads();
  float* staged = reinterpret_cast<float*>(smem + QTile::kBytes);  // [kWarpsN][kBM][kStaged]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_w + fused::frag_row(lane) + half * fused::kFragRowHalf;
    float* dst = staged + (wn * kBM + r) * kStaged;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<float2*>(dst + dt * fused::kMmaN + fused::frag_col(lane)) =
          make_float2(acc_o[0][dt][2 * half], acc_o[0][dt][2 * half + 1]);
    if (lane % 4 == 0) s_lse[wn * kBM + r] = lse[half];
  }
  __syncthreads();

  // Row r's kWarpsN results merged in warp order: m = max lse_w, weights
  // e^(lse_w - m) (exactly 1 for a lone warp), O = sum w O_w / sum w.
  constexpr int kThreadsPerRow = kThreads / kBM;
  static_assert(kThreads % kBM == 0 && kD % (2 * kThreadsPerRow) == 0, "columns in pairs");
  const int r = tid / kThreadsPerRow;
  const int row = m0 + r;
  if (row >= rows_total) return;
  const int i = row / group, h = hk * group + row % group;
  float m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarpsN; ++w) m = fmaxf(m, s_lse[w * kBM + r]);
  float weight[kWarpsN];
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarpsN; ++w) {
    weight[w] = m == -INFINITY ? 0.0f : expf(s_lse[w * kBM + r] - m);
    sum += weight[w];
  }
  const float inv = m == -INFINITY ? 0.0f : 1.0f / sum;
  const float row_lse = m == -INFINITY ? -INFINITY : m + logf(sum);
  const int64_t part_row = (int64_t(split) * p.B + b) * p.H * p.Tq + int64_t(h) * p.Tq + i;
  Elem* o = static_cast<Elem*>(p.o) + b * p.o_stride.batch + int64_t(i) * p.o_stride.row +
            h * p.o_stride.head;
  for (int c = (tid % kThreadsPerRow) * 2; c < kD; c += 2 * kThreadsPerRow) {
    float x0 = 0.0f, x1 = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsN; ++w) {
      const float2 v = *reinterpret_cast<const float2*>(staged + (w * kBM + r) * kStaged + c);
      x0 = fmaf(weight[w], v.x, x0);
      x1 = fmaf(weight[w], v.y, x1);
    }
    if (p.num_splits == 1) {
      if (c < p.head_dim)
        *reinterpret_cast<uint32_t*>(o + c) = fused::pack2<Elem>(x0 * inv, x1 * inv);
    } else {
      *reinterpret_cast<float2*>(p.o_part + part_row * kD + c) = make_float2(x0 * inv, x1 * inv);
    }
  }
  if (tid % kThreadsPerRow == 0) {
    if (p.num_splits > 1)
      p.lse_part[part_row] = row_lse;
    else if (p.lse != nullptr)
      p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = row_lse;
  }
}

}  // namespace gqattn::kv_cache
