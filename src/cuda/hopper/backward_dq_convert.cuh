// cuda-hopper: the fused dQ's last kernel: dq = scale * the f32 accumulator
// the dK/dV kernel reduce-added into (backward_params.hpp dq_accum_block and
// the staging order of backward_dq_fused.cuh), in the 16-bit output type,
// rows < Tq only. Query tiles no key tile visits give 0 without reading the
// accumulator (the ordered mode does not zero it).
// Checked by tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cstdint>

#include "cuda/flash/mask.cuh"
#include "cuda/flash/mma.cuh"
#include "cuda/hopper/backward_params.hpp"

namespace gqattn::hopper::bwd {

// One thread per float4 of the accumulator: thread i of warpgroup part w,
// n8 block c holds rows r, r + 8 (r = 16 (i / 32) + (i % 32) / 4) and
// columns w kDqCols + 8 c + 2 (i % 4), + 1 of the block's query tile.
template <int kD, typename Elem>
__global__ void __launch_bounds__(kDqConvertThreads)
    backward_dq_convert_kernel(const __grid_constant__ BackwardParams p) {
  using Tile = DkdvTile<kD>;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kCols = Tile::kDqCols;
  constexpr int64_t kPerBlock = int64_t(kBM) * kD / 4;    // float4 per query tile
  constexpr int64_t kPerPart = int64_t(kBM) * kCols / 4;  // per warpgroup part
  const flash::BackwardParams& c = p.c;
  const int64_t idx = int64_t(blockIdx.x) * kDqConvertThreads + threadIdx.x;
  const int64_t tiles = c.tq_padded / kBM;
  if (idx >= int64_t(c.B) * c.H * tiles * kPerBlock) return;
  const int64_t block = idx / kPerBlock;
  const int part = int((idx % kPerBlock) / kPerPart);
  const int within = int(idx % kPerPart);
  const int nb = within / kWarpgroupThreads, i = within % kWarpgroupThreads;
  const int lane = i % kWarpSize;
  const int row = int(block % tiles) * kBM + (i / kWarpSize) * flash::kMmaM + flash::frag_row(lane);
  const int col = part * kCols + nb * flash::kMmaN + flash::frag_col(lane);
  const int64_t bh = block / tiles;
  const int64_t b = bh / c.H, h = bh % c.H;
  const int m0 = int(block % tiles) * kBM;
  if (m0 >= c.mask.tq) return;  // a padding tile: no row to write
  const flash::MaskPolicy mask(c.mask);
  const flash::BlockRange keys = mask.key_blocks(m0, min(kBM, c.mask.tq - m0), Tile::kBlockN);
  const bool visited = keys.last >= keys.first;
  const float4 v =
      visited ? reinterpret_cast<const float4*>(p.dq_accum)[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
  Elem* out = static_cast<Elem*>(c.dq) + b * c.dq_stride.batch + h * c.dq_stride.head + col;
  const float scale = c.score.scale;
  if (row < c.mask.tq)
    *reinterpret_cast<uint32_t*>(out + int64_t(row) * c.dq_stride.row) =
        flash::pack2<Elem>(v.x * scale, v.y * scale);
  if (row + flash::kFragRowHalf < c.mask.tq)
    *reinterpret_cast<uint32_t*>(out + int64_t(row + flash::kFragRowHalf) * c.dq_stride.row) =
        flash::pack2<Elem>(v.z * scale, v.w * scale);
}

}  // namespace gqattn::hopper::bwd
