// cuda-hopper: the fused dQ's last kernel: dq = scale * the f32 accumulator
// the dK/dV kernel reduce-added into (backward_params.hpp dq_accum_block and
// the staging order of backward_dq_fused.cuh), in the 16-bit output type,
// rows < Tq only. Query tiles no key tile visits give 0 without reading the
// accumulator (it is not zeroed).
// Checked by tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cstdint>

#include "cuda/flash/mask.cuh"
#include "cuda/flash/mma.cuh"
#include "cuda/hopper/backward_params.hpp"

namespace gqattn::hopper::bwd {

// One CTA per accumulator block (b, h, query tile of kBlockM rows), in two
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
  const int64_t tiles = c.tq_padded / kBM;
  const int64_t block = blockIdx.x;
  const int m0 = int(block % tiles) * kBM;
  if (m0 >= c.mask.tq) return;  // a padding tile: no row to write
  const int64_t bh = block / tiles;
  const int64_t b = bh / c.H, h = bh % c.H;
  const int rows = min(kBM, c.mask.tq - m0);
  Elem* out = static_cast<Elem*>(c.dq) + b * c.dq_stride.batch + h * c.dq_stride.head +
              int64_t(m0) * c.dq_stride.row;
  const int tid = int(threadIdx.x);

  // Query tiles no key tile visits were never written: their dq is 0 (the
  // accumulator is not read, it holds stale data).
  const flash::MaskPolicy mask(c.mask);
  const flash::BlockRange keys = mask.key_blocks(m0, rows, Tile::kBlockN);
  if (keys.last < keys.first) {
    for (int o = tid; o < rows * kPairsPerRow; o += kDqConvertThreads)
      *reinterpret_cast<uint32_t*>(out + int64_t(o / kPairsPerRow) * c.dq_stride.row +
                                   2 * (o % kPairsPerRow)) = flash::pack2<Elem>(0.0f, 0.0f);
    return;
  }

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

  const float scale = p.dkdq_scale;
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

}  // namespace gqattn::hopper::bwd
