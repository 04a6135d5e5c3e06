// cuda-hopper: the fused dQ's last kernel: dq = scale * the f32 accumulator
// the dK/dV kernel reduce-added into (backward_params.hpp dq_accum_block and
// the staging order of backward_dq_fused.cuh), in the 16-bit output type,
// rows < Tq only. Query tiles no key tile visits give 0 without reading the
// accumulator (it is not zeroed). With kBwdDqConvertOverlap it starts while
// the dK/dV kernel still runs (programmatic dependent launch, launch_backward.cuh):
// a block is converted only once its semaphore counts every key tile that
// visits its query tile, which makes the dK/dV kernel's adds to it visible
// (their writer releases the semaphore after its write has completed).
// Checked by tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cstdint>

#include "cuda/flash/mask.cuh"
#include "cuda/flash/mma.cuh"
#include "cuda/hopper/backward_dq_fused.cuh"
#include "cuda/hopper/backward_params.hpp"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/grid_dependency.cuh"

namespace gqattn::hopper::bwd {

// The accumulator block (b, h, query tile) that task j of the conversion
// takes: query tiles from the last down, every (b, h) of one query tile in
// a row. Under a causal mask the key tiles walk their query tiles last
// first, so the last query tiles are complete first and the first ones
// (reached last by the longest key tiles) last; without a mask all
// complete at about the same time.
__device__ __forceinline__ int64_t dq_convert_block(int64_t j, int64_t tiles, int64_t bh_count) {
  const int64_t m = tiles - 1 - j / bh_count;
  return (j % bh_count) * tiles + m;
}

// CTAs take accumulator blocks (b, h, query tile of kBlockM rows) in the
// order of dq_convert_block, every gridDim.x-th task; each block in two
// phases through shared memory, so that both the f32 reads and the 16-bit
// writes are contiguous across a warp:
// 1. each thread reads float4s of the block in storage order (coalesced):
//    float4 i of warpgroup part w, n8 block c holds rows r, r + 8
//    (r = 16 (i / 32) + (i % 32) / 4) and columns w kDqCols + 8 c +
//    2 (i % 4), + 1 of the query tile; it puts them at their (row, column)
//    in a row-major tile;
// 2. each warp writes whole rows: lane l the column pair 2 l (+ 64 k), one
//    32-bit store each (the dq rule is 4-byte alignment), 128 contiguous
//    bytes per warp store.
// Before its first read of a block, thread 0 waits until the block's
// semaphore reads the number of key tiles that visit the query tile (each
// increments it once its add has completed); at the end every thread waits
// for the dK/dV grid to complete (griddepcontrol.wait; nothing to wait for
// without programmatic dependent launch), so that this grid completes after
// it and the work that follows it on the stream sees dk and dv.
template <int kD, typename Elem>
__global__ void __launch_bounds__(kDqConvertThreads)
    backward_dq_convert_kernel(const __grid_constant__ BackwardParams p) {
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
  __shared__ __align__(16) float tile[kBM * kPitch];

  const flash::BackwardParams& c = p.c;
  const flash::MaskPolicy mask(c.mask);
  const int64_t tiles = c.tq_padded / kBM;
  const int64_t bh_count = int64_t(c.B) * c.H;
  const int tid = int(threadIdx.x);
  const float scale = p.dkdq_scale;
  for (int64_t j = blockIdx.x; j < tiles * bh_count; j += gridDim.x) {
    const int64_t block = dq_convert_block(j, tiles, bh_count);
    const int m0 = int(block % tiles) * kBM;
    if (m0 >= c.mask.tq) continue;  // a padding tile: no row to write
    const int64_t bh = block / tiles;
    const int64_t b = bh / c.H, h = bh % c.H;
    const int rows = min(kBM, c.mask.tq - m0);
    Elem* out = static_cast<Elem*>(c.dq) + b * c.dq_stride.batch + h * c.dq_stride.head +
                int64_t(m0) * c.dq_stride.row;

    // Query tiles no key tile visits were never written: their dq is 0 (the
    // accumulator is not read, it holds stale data).
    const flash::BlockRange keys = mask.key_blocks(m0, rows, Tile::kBlockN);
    if (keys.last < keys.first) {
      for (int o = tid; o < rows * kPairsPerRow; o += kDqConvertThreads)
        *reinterpret_cast<uint32_t*>(out + int64_t(o / kPairsPerRow) * c.dq_stride.row +
                                     2 * (o % kPairsPerRow)) = flash::pack2<Elem>(0.0f, 0.0f);
      continue;
    }
    if (tid == 0) {
      const int adders = keys.last - keys.first + 1;
      while (ptx::ld_acquire_gpu(p.dq_semaphores + block) != adders) __nanosleep(kDqSpinNs);
    }
    // Also: the previous block's reads of `tile` are done.
    __syncthreads();

    const float4* src = reinterpret_cast<const float4*>(p.dq_accum) + block * kPerBlock;
#pragma unroll
    for (int k = 0; k < kPerBlock / kDqConvertThreads; ++k) {
      const int f = k * kDqConvertThreads + tid;
      const int part = f / kPerPart, within = f % kPerPart;
      const int nb = within / kWarpgroupThreads, i = within % kWarpgroupThreads;
      const int lane = i % kWarpSize;
      const int row = (i / kWarpSize) * flash::kMmaM + flash::frag_row(lane);
      const int col = part * kCols + nb * flash::kMmaN + flash::frag_col(lane);
      const float4 v = src[f];
      *reinterpret_cast<float2*>(&tile[row * kPitch + col]) = make_float2(v.x, v.y);
      *reinterpret_cast<float2*>(&tile[(row + flash::kFragRowHalf) * kPitch + col]) =
          make_float2(v.z, v.w);
    }
    __syncthreads();

#pragma unroll
    for (int k = 0; k < kBM * kPairsPerRow / kDqConvertThreads; ++k) {
      const int o = k * kDqConvertThreads + tid;
      const int row = o / kPairsPerRow, col = 2 * (o % kPairsPerRow);
      if (row >= rows) continue;
      const float2 v = *reinterpret_cast<const float2*>(&tile[row * kPitch + col]);
      *reinterpret_cast<uint32_t*>(out + int64_t(row) * c.dq_stride.row + col) =
          flash::pack2<Elem>(v.x * scale, v.y * scale);
    }
  }
  ptx::wait_on_prerequisites();
}

}  // namespace gqattn::hopper::bwd
