// cuda-hopper: a consumer warpgroup's 64 accumulator rows stored by TMA
// through shared memory, the two halves every staged epilogue shares (the
// forward's O, epilogue.cuh; the backward's dK, dV, dQ,
// backward_epilogue.cuh): each thread writes its part of the rounded rows
// into a K-major [64 x kCols] tile with the 128-byte swizzle the tensor's
// TMA map expects (stage_rows), and after the caller's fence and barrier one
// thread stores the tile, one TMA store per 64 columns (store_staged_tile),
// which clips rows past the tensor's end. The callers own the barriers and
// the bulk async-group's waits. Checked by tests/gpu/test_hopper_forward.cpp
// and test_hopper_backward.cpp (staged and plain stores must give the same
// bits; NaN-poisoned outputs catch unwritten rows).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/operand_layout.hpp"
#include "cuda/hopper/ptx/stmatrix.cuh"
#include "cuda/hopper/ptx/tma.cuh"

namespace gqattn::hopper {

// The thread of each warpgroup that issues its staged stores (and so owns
// their bulk async-group and its waits).
__device__ __forceinline__ bool staged_store_issuer() {
  return int(threadIdx.x) % kWarpgroupThreads == 0;
}

// This thread's part of acc * mult (the wgmma accumulator layout), rounded,
// into the tile at `staging` (1024-byte aligned). With kByStmatrix one
// stmatrix.x4 per two 8-column blocks (operand_layout.hpp
// accumulator_stmatrix_offset): each of its four 8 x 8 matrices is 8 rows
// of one 16-byte chunk, which the swizzle puts on 8 distinct chunk
// positions. Otherwise one 32-bit store per block and row: per store
// instruction the 8 rows of a warp hit 8 different 16-byte chunks (the
// swizzle XORs the chunk with row % 8). No bank conflict either way.
// kByStmatrix: the forward passes true
// (docs/decisions/hopper-forward-stmatrix-staging.md), the backward too
// (docs/decisions/hopper-backward-stmatrix-staging.md).
template <int kCols, typename Elem, bool kByStmatrix>
__device__ __forceinline__ void stage_rows(uint32_t staging, const float (&acc)[kCols / 8][4],
                                           float mult) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  if constexpr (kByStmatrix) {
    static_assert(kCols % 16 == 0, "stmatrix.x4 takes two 8-column blocks");
#pragma unroll
    for (int i = 0; i < kCols / 8; i += 2) {
      ptx::stmatrix_x4(staging + accumulator_stmatrix_offset(i, warp, lane, kWgmmaM),
                       fused::pack2<Elem>(acc[i][0] * mult, acc[i][1] * mult),
                       fused::pack2<Elem>(acc[i][2] * mult, acc[i][3] * mult),
                       fused::pack2<Elem>(acc[i + 1][0] * mult, acc[i + 1][1] * mult),
                       fused::pack2<Elem>(acc[i + 1][2] * mult, acc[i + 1][3] * mult));
    }
    return;
  }
  const int col0 = fused::frag_col(lane);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp * fused::kMmaM + fused::frag_row(lane) + half * fused::kFragRowHalf;
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) {
      const uint32_t addr = staging + k_major_offset(row, i * 8 + col0, kWgmmaM);
      const uint32_t pair =
          fused::pack2<Elem>(acc[i][2 * half] * mult, acc[i][2 * half + 1] * mult);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pair) : "memory");
    }
  }
}

// One thread, after every thread's stage_rows, a fence_proxy_async_shared
// and a barrier: rows [row0, row0 + 64), columns [col0, col0 + kCols) of
// `map` (d, heads, T, B) at (head, batch), in the thread's bulk async-group
// (the caller commits).
template <int kCols>
__device__ __forceinline__ void store_staged_tile(const CUtensorMap* map, uint32_t staging,
                                                  int row0, int col0, int head, int batch) {
  constexpr uint32_t kBlockBytes = uint32_t(kWgmmaM) * kSwizzleBytes;
#pragma unroll
  for (int c = 0; c < kCols / kColBlock; ++c)
    ptx::tma_store_4d(map, staging + c * kBlockBytes, col0 + c * kColBlock, head, row0, batch);
}

}  // namespace gqattn::hopper
