// cuda-flash: the backward's preprocessing kernel. For every (b, h, query i)
// it writes the two per-row terms the dK/dV and dQ kernels read, into a
// workspace [B*H, tq_padded] of f32 (BackwardParams):
//   dsum[i] = D_i = sum_d do_i * o_i   (FlashAttention-2's rowsum(dO o O))
//   lse2[i] = lse_i * log2(e) - lse2_shift, or +inf when lse_i = -inf (no
//             kept key); lse2_shift is 0 but for cuda-hopper's softcap
//             backward (params.hpp)
// and, for the padding rows i >= Tq, dsum = 0 and lse2 = +inf, so every P of
// those rows is exactly 0 and whole query tiles load without bounds checks.
// Checked through the backward tests (tests/gpu/test_flash_*.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/fused/fragment.cuh"
#include "cuda/fused/params.hpp"

namespace gqattn::fused {

using gqattn::cuda::to_float2;

// Dot product of two 16-byte chunks of 8 elements, in f32.
template <typename Elem>
__device__ __forceinline__ float chunk_dot(const uint4& a, const uint4& b) {
  const uint32_t av[4] = {a.x, a.y, a.z, a.w};
  const uint32_t bv[4] = {b.x, b.y, b.z, b.w};
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = to_float2<Elem>(av[i]);
    const float2 y = to_float2<Elem>(bv[i]);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
  return acc;
}

template <int kD, typename Elem>
__global__ void __launch_bounds__(kPreprocessThreads)
    backward_preprocess_kernel(const BackwardParams p) {
  constexpr int kChunks = kD / kElemsPerChunk;
  const int tid = threadIdx.x;
  const int sub = tid % kPreprocessLanesPerRow;
  const int64_t row_global = int64_t(blockIdx.x) * kPreprocessRowsPerBlock +
                             tid / kPreprocessLanesPerRow;  // over [B*H, tq_padded]
  const int bh = int(row_global / p.tq_padded);
  const int i = int(row_global % p.tq_padded);
  const int b = bh / p.H;
  const int h = bh % p.H;
  const bool valid = i < p.mask.tq;

  float acc = 0.0f;
  if (valid) {
    const Elem* o = static_cast<const Elem*>(p.o) + b * p.o_stride.batch +
                    int64_t(i) * p.o_stride.row + h * p.o_stride.head;
    const Elem* d_o = static_cast<const Elem*>(p.dout) + b * p.do_stride.batch +
                      int64_t(i) * p.do_stride.row + h * p.do_stride.head;
#pragma unroll
    for (int c = sub; c < kChunks; c += kPreprocessLanesPerRow) {
      const uint4 x = *reinterpret_cast<const uint4*>(o + c * kElemsPerChunk);
      const uint4 y = *reinterpret_cast<const uint4*>(d_o + c * kElemsPerChunk);
      acc += chunk_dot<Elem>(x, y);
    }
  }
#pragma unroll
  for (int width = 1; width < kPreprocessLanesPerRow; width *= 2)
    acc += __shfl_xor_sync(kFullWarp, acc, width);

  if (sub == 0) {
    float lse2 = INFINITY;
    if (valid) {
      const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i];
      if (lse != -INFINITY) lse2 = lse * kLog2e - p.lse2_shift;
    }
    p.dsum[row_global] = valid ? acc : 0.0f;
    p.lse2[row_global] = lse2;
  }
}

}  // namespace gqattn::fused
