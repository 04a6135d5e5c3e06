// cuda-hopper: the forward's epilogue: a consumer warp's O rows (already
// normalised, f32 in the wgmma accumulator layout) rounded to the I/O type
// and stored from registers, two columns per 32-bit store, and lse (natural
// log) stored by the lane that owns each row. Rows past Tq are not written;
// lse is skipped when p.lse is null. Checked by
// tests/gpu/test_hopper_forward.cpp (NaN-poisoned outputs catch unwritten
// rows). TODO(perf): stage O through shared memory and store it by TMA.
#pragma once

#include <cstdint>

#include "cuda/flash/mma.cuh"
#include "cuda/hopper/consumer.cuh"
#include "cuda/hopper/params.hpp"
#include "cuda/hopper/tile_coord.cuh"
#include "cuda/hopper/tile_sizes.hpp"

namespace gqattn::hopper {

template <int kD, typename Elem>
__device__ __forceinline__ void store_output(const ForwardParams& p, const TileCoord& tile, int tq,
                                             int wg, const ConsumerResult<kD>& r) {
  constexpr int kHalfRows = flash::kFragRowHalf;  // a fragment's second row is g + 8
  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int row0 = tile.m0 + wg * kWgmmaM + warp * flash::kMmaM + flash::frag_row(lane);
  const int col0 = flash::frag_col(lane);
  Elem* o = static_cast<Elem*>(p.o) + tile.b * p.o_stride.batch + tile.h * p.o_stride.head;
  float* lse =
      p.lse == nullptr ? nullptr : p.lse + tile.b * p.lse_batch_stride + tile.h * p.lse_head_stride;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + half * kHalfRows;
    if (row >= tq) continue;
    Elem* o_row = o + int64_t(row) * p.o_stride.row + col0;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i)
      *reinterpret_cast<uint32_t*>(o_row + i * 8) =
          flash::pack2<Elem>(r.o[0][i][2 * half], r.o[0][i][2 * half + 1]);
    if (lse != nullptr && col0 == 0) lse[row] = r.lse[half];
  }
}

}  // namespace gqattn::hopper
