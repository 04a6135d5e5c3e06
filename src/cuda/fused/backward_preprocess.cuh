// cuda-flash: the backward's preprocessing kernel. For every (b, h, query i)
// it writes the two per-row terms the dK/dV and dQ kernels read, into a
// workspace [B*H, tq_padded] of f32 (BackwardParams):
//   dsum[i] = D_i = sum_d do_i * o_i   (FlashAttention-2's rowsum(dO o O))
//   lse2[i] = lse_i * log2(e) - lse2_shift, or +inf when lse_i = -inf (no
//             kept key); lse2_shift is 0 but for cuda-hopper's softcap
//             backward (params.hpp)
// and, for the padding rows i >= Tq, dsum = 0 and lse2 = +inf, so every P of
// those rows is exactly 0 and whole query tiles load without bounds checks.
// A padded head dim (p.head_dim < kD) reads only the tensors' columns.
// A varlen batch: the same over (b, h, i < tq_padded), sequence b's rows
// (sequence.hpp) going to its workspace block (workspace_row), which has
// its tq_b rounded up to kWorkspaceRowAlign rows; threads past that write
// nothing (those rows belong to the next sequence's block or to none).
// Checked through the backward tests (tests/gpu/test_flash_*.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/fused/fragment.cuh"
#include "cuda/fused/params.hpp"
#include "cuda/fused/sequence.hpp"

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
  const Sequence seq = sequence_of(p.seq, p.mask, b);
  const bool valid = i < seq.mask.tq;
  // The rows of the (b, h) block: all tq_padded of a dense batch; a varlen
  // sequence's tq rounded up (the next rows are the next sequence's).
  const bool in_block =
      i < (seq.mask.tq + kWorkspaceRowAlign - 1) / kWorkspaceRowAlign * kWorkspaceRowAlign;
  const int64_t row = workspace_row(p, b, h, seq.ws_row0) + i;  // row_global when dense
  const int64_t q_row = int64_t(seq.q_row0) + i;

  float acc = 0.0f;
  if (valid) {
    const Elem* o = static_cast<const Elem*>(p.o) + b * p.o_stride.batch + q_row * p.o_stride.row +
                    h * p.o_stride.head;
    const Elem* d_o = static_cast<const Elem*>(p.dout) + b * p.do_stride.batch +
                      q_row * p.do_stride.row + h * p.do_stride.head;
#pragma unroll
    for (int c = sub; c < kChunks; c += kPreprocessLanesPerRow) {
      if (c * kElemsPerChunk >= p.head_dim) break;
      const uint4 x = *reinterpret_cast<const uint4*>(o + c * kElemsPerChunk);
      const uint4 y = *reinterpret_cast<const uint4*>(d_o + c * kElemsPerChunk);
      acc += chunk_dot<Elem>(x, y);
    }
  }
#pragma unroll
  for (int width = 1; width < kPreprocessLanesPerRow; width *= 2)
    acc += __shfl_xor_sync(kFullWarp, acc, width);

  if (sub == 0 && in_block) {
    float lse2 = INFINITY;
    if (valid) {
      const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + q_row];
      if (lse != -INFINITY) lse2 = lse * kLog2e - p.lse2_shift;
    }
    p.dsum[row] = valid ? acc : 0.0f;
    p.lse2[row] = lse2;
  }
}

}  // namespace gqattn::fused
