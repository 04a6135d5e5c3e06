// cuda-hopper: the fused dQ's last kernel: dq = scale * the f32 accumulator
// the dK/dV kernel reduce-added into (backward_params.hpp dq_accum_block and
// the staging order of backward_dq_fused.cuh), in the 16-bit output type,
// rows < Tq only. Query tiles no key tile visits give 0 without reading the
// accumulator (it is not zeroed). It starts while the dK/dV kernel still
// runs (programmatic dependent launch, launch.cuh;
// docs/decisions/hopper-backward-dq-convert-overlap.md):
// a block is converted only once its semaphore counts every key tile that
// visits its query tile, which makes the dK/dV kernel's adds to it visible
// (their writer releases the semaphore after its write has completed).
// Checked by tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/hopper/backward/common.cuh"  // GQATTN_HOPPER_BWD_DEVICE_CODE
#include "cuda/hopper/backward/dq_convert_tasks.hpp"
#include "cuda/hopper/backward/dq_fused.cuh"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/backward/sequence.cuh"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/grid_dependency.cuh"

namespace gqattn::hopper::bwd {

// Each CTA converts its blocks in whatever order they become complete
// (dq is elementwise in the accumulator, so the bits do not depend on it):
// warp 0 polls a chunk of 32 pending tasks, one per lane (a block is
// complete when its semaphore counts every key tile that visits its query
// tile: each increments it, release, once its add has completed; the
// lane's acquire load and the barrier after it make the adds visible to
// the whole CTA), and the CTA converts the complete ones; then the next
// chunk, round and round, with a back-off after a round without progress.
// Under programmatic dependent launch the grid may start once every dK/dV
// CTA has started, while the last ones still add. A block in two phases
// through shared memory, so that both the f32 reads and the 16-bit writes
// are contiguous across a warp:
// 1. each thread reads float4s of the block in storage order (coalesced):
//    float4 i of warpgroup part w, n8 block c holds rows r, r + 8
//    (r = 16 (i / 32) + (i % 32) / 4) and columns w kDqCols + 8 c +
//    2 (i % 4), + 1 of the query tile; it puts them at their (row, column)
//    in a row-major tile;
// 2. each warp writes whole rows: lane l the column pair 2 l (+ 64 k), one
//    32-bit store each (the dq rule is 4-byte alignment), 128 contiguous
//    bytes per warp store.
// At the end every thread waits for the dK/dV grid to complete
// (griddepcontrol.wait; nothing to wait for without programmatic dependent
// launch), so that this grid completes after it and the work that follows
// on the stream sees dk and dv.
template <int kD, typename Elem, bool kVarlen>
__global__ void __launch_bounds__(kDqConvertThreads)
    backward_dq_convert_kernel(const __grid_constant__ BackwardParams p) {
#ifdef GQATTN_HOPPER_BWD_DEVICE_CODE
  using Tile = DkdvTile<kD>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kCols = Tile::kDqCols;
  constexpr int kPerBlock = kBM * kD / 4;    // float4 per query tile
  constexpr int kPerPart = kBM * kCols / 4;  // per warpgroup part
  constexpr int kPairsPerRow = kD / 2;       // 32-bit outputs per row
  // Row pitch in floats: 8 more than d, so that the 8 rows a warp's
  // fragment stores hit (row 8 mod 32 words apart) fill all 32 banks per
  // 4 rows: two wavefronts per 256 bytes, the minimum.
  constexpr int kPitch = kD + 8;
  static_assert(kPerBlock % kDqConvertThreads == 0, "whole float4 rounds");
  static_assert((kBM * kPairsPerRow) % kDqConvertThreads == 0, "whole output rounds");
  static_assert(kPairsPerRow % kWarpSize == 0, "a warp store stays in one row");
  static_assert(kDqConvertChunk == kWarpSize, "warp 0 polls one task per lane");
  __shared__ __align__(16) float tile[kBM * kPitch];
  __shared__ uint32_t complete;          // the polled chunk's complete tasks
  extern __shared__ uint32_t pending[];  // chunk q, bit l: task 32 q + l not converted yet

  const fused::BackwardParams& c = p.c;
  const fused::MaskPolicy mask(c.mask);
  const int64_t tiles = c.tq_padded / kBM;
  const int64_t bh_count = int64_t(c.B) * c.H;
  const int64_t blocks = tiles * bh_count;
  const int tid = int(threadIdx.x);
  const int lane = tid % kWarpSize;
  const float scale = p.dkdq_scale;
  const int64_t tasks = dq_convert_tasks(blocks, gridDim.x, blockIdx.x);
  const int chunks = int((tasks + kDqConvertChunk - 1) / kDqConvertChunk);
  // Task j converts query tile m of (b, h), block j's place in [B*H,
  // tiles]; a varlen batch's sequence (looked up per task) gives the
  // accumulator block and the rows, a dense batch's block is the place.
  const auto block_of = [&](int64_t task) {
    return dq_convert_block(blockIdx.x + task * gridDim.x, tiles, bh_count);
  };
  const auto sequence_at = [&](int64_t block) {
    return backward_sequence<kVarlen>(c, int(block / tiles / c.H));
  };
  const auto accum_block = [&](int64_t block) -> int64_t {
    if constexpr (kVarlen) {
      const int64_t bh = block / tiles;
      const fused::Sequence seq = sequence_at(block);
      return (workspace_row<true>(c, int(bh / c.H), int(bh % c.H), seq.ws_row0) +
              (block % tiles) * kBM) /
             kBM;
    } else {
      return block;
    }
  };
  // Key tiles that add into `block` (0: nothing to wait for; padding
  // query tiles past the sequence's tq count as none).
  const auto adders = [&](int64_t block) {
    const int m0 = int(block % tiles) * kBM;
    if constexpr (kVarlen) {
      const fused::Sequence seq = sequence_at(block);
      if (m0 >= seq.mask.tq) return 0;
      const fused::MaskPolicy seq_mask(seq.mask);
      const fused::BlockRange keys =
          seq_mask.key_blocks(m0, min(kBM, seq.mask.tq - m0), Tile::kBlockN);
      return max(0, keys.last - keys.first + 1);
    } else {
      if (m0 >= c.mask.tq) return 0;
      const fused::BlockRange keys = mask.key_blocks(m0, min(kBM, c.mask.tq - m0), Tile::kBlockN);
      return max(0, keys.last - keys.first + 1);
    }
  };

  for (int q = tid; q < chunks; q += kDqConvertThreads) {
    const int64_t in_chunk = min(int64_t(kDqConvertChunk), tasks - int64_t(q) * kDqConvertChunk);
    pending[q] = in_chunk == kDqConvertChunk ? ~0u : (1u << in_chunk) - 1u;
  }
  __syncthreads();

  int64_t left = tasks;
  bool progress = false;
  for (int q = 0; left > 0; q = q + 1 == chunks ? 0 : q + 1) {
    if (tid < kWarpSize) {
      const uint32_t waiting = pending[q];
      bool done = false;
      if ((waiting >> lane) & 1u) {
        const int64_t block = block_of(int64_t(q) * kDqConvertChunk + lane);
        const int n = adders(block);
        done = n == 0 || ptx::ld_acquire_gpu(p.dq_semaphores + accum_block(block)) == n;
      }
      const uint32_t ready = __ballot_sync(0xffffffffu, done);
      if (lane == 0) {
        complete = ready;
        pending[q] = waiting & ~ready;
      }
    }
    __syncthreads();
    const uint32_t ready = complete;
    for (uint32_t bits = ready; bits != 0; bits &= bits - 1) {
      const int64_t block = block_of(int64_t(q) * kDqConvertChunk + __ffs(bits) - 1);
      const int m0 = int(block % tiles) * kBM;
      const fused::Sequence seq = sequence_at(block);  // dense: the batch's
      if (m0 >= seq.mask.tq) continue;                 // a padding tile: no row to write
      const int64_t bh = block / tiles;
      const int64_t b = bh / c.H, h = bh % c.H;
      const int rows = min(kBM, seq.mask.tq - m0);
      const int64_t row0 = kVarlen ? int64_t(seq.q_row0) + m0 : int64_t(m0);  // packed row
      const int64_t tb = kVarlen ? 0 : b;  // varlen: one packed batch
      Elem* out = static_cast<Elem*>(c.dq) + tb * c.dq_stride.batch + h * c.dq_stride.head +
                  row0 * c.dq_stride.row;
      // Query tiles no key tile visits were never written: their dq is 0
      // (the accumulator is not read, it holds stale data).
      if (adders(block) == 0) {
        for (int o = tid; o < rows * kPairsPerRow; o += kDqConvertThreads)
          if (2 * (o % kPairsPerRow) < c.head_dim)
            *reinterpret_cast<uint32_t*>(out + int64_t(o / kPairsPerRow) * c.dq_stride.row +
                                         2 * (o % kPairsPerRow)) = fused::pack2<Elem>(0.0f, 0.0f);
        continue;
      }
      const float4* src =
          reinterpret_cast<const float4*>(p.dq_accum) + accum_block(block) * kPerBlock;
#pragma unroll
      for (int k = 0; k < kPerBlock / kDqConvertThreads; ++k) {
        const int f = k * kDqConvertThreads + tid;
        const int part = f / kPerPart, within = f % kPerPart;
        const int nb = within / kWarpgroupThreads, i = within % kWarpgroupThreads;
        const int row = (i / kWarpSize) * fused::kMmaM + fused::frag_row(i % kWarpSize);
        const int col = part * kCols + nb * fused::kMmaN + fused::frag_col(i % kWarpSize);
        const float4 v = src[f];
        *reinterpret_cast<float2*>(&tile[row * kPitch + col]) = make_float2(v.x, v.y);
        *reinterpret_cast<float2*>(&tile[(row + fused::kFragRowHalf) * kPitch + col]) =
            make_float2(v.z, v.w);
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kBM * kPairsPerRow / kDqConvertThreads; ++k) {
        const int o = k * kDqConvertThreads + tid;
        const int row = o / kPairsPerRow, col = 2 * (o % kPairsPerRow);
        if (row >= rows || col >= c.head_dim) continue;  // past a padded head dim: none
        const float2 v = *reinterpret_cast<const float2*>(&tile[row * kPitch + col]);
        *reinterpret_cast<uint32_t*>(out + int64_t(row) * c.dq_stride.row + col) =
            fused::pack2<Elem>(v.x * scale, v.y * scale);
      }
      __syncthreads();  // `tile` is free for the next block
    }
    left -= __popc(ready);
    progress = progress || ready != 0;
    if (q + 1 == chunks) {
      // A whole round without a complete block: the dK/dV kernel's adds
      // are still on their way.
      if (!progress) __nanosleep(kDqSpinNs);
      progress = false;
    }
    __syncthreads();  // `complete` is read by all before warp 0 rewrites it
  }
  ptx::wait_on_prerequisites();
#else
  (void)p;
  __trap();  // no sm_90a code in this pass: never launched (see why_not)
#endif
}

}  // namespace gqattn::hopper::bwd
