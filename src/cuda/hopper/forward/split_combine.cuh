// cuda-hopper: the second kernel of a split-KV forward (split_kv.hpp): per
// query row (batch, head, query), the num_splits partials the forward
// kernel's tasks wrote (O normalised over each split's key range, f32, and
// its lse, natural log) become the row's O and lse:
//   m = max_s lse_s,  w_s = exp(lse_s - m),  lse = m + log(sum_s w_s),
//   O = sum_s w_s O_s / sum_s w_s,
// summed in split order, so the result is deterministic. If m is -inf no
// split kept a key of the row: O = 0, lse = -inf (w would be exp(-inf -
// -inf) = NaN, so that case never computes a weight). One warp per row,
// kD / 32 contiguous columns per lane. Checked by
// tests/gpu/test_hopper_forward.cpp (every case with the rule's splits and
// with GQATTN_HOPPER_SPLIT_KV=3, empty ranges included, against the f64
// oracle, and bitwise determinism).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/fused/sequence.hpp"
#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/ptx/grid_dependency.cuh"

namespace gqattn::hopper {

constexpr int kCombineWarps = 4;  // rows per block
constexpr int kCombineThreads = kCombineWarps * kWarpSize;

// kVarlen: rows of a varlen batch's partials (laid out by max_seqlen_q):
// row q of sequence b is merged only where q < tq_b, into packed row
// q_row0 + q of o and lse (the rows past tq_b were never written and belong
// to no output row of b).
template <int kD, typename Elem, bool kVarlen = false>
__global__ void __launch_bounds__(kCombineThreads)
    forward_combine_kernel(const __grid_constant__ ForwardParams p) {
  // Launched by programmatic dependent launch (docs/decisions/hopper-forward-split-kv.md): the
  // forward grid's partials are complete and visible only after this
  // (without the launch attribute it returns at once).
  ptx::wait_on_prerequisites();
  constexpr int kPerLane = kD / kWarpSize;
  static_assert(kPerLane % 2 == 0, "columns go out in pairs");
  const int tq = p.mask.tq;
  const int64_t rows = int64_t(p.B) * p.H * tq;
  const int64_t row = int64_t(blockIdx.x) * kCombineWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int lane = int(threadIdx.x) % kWarpSize;
  int q_row0 = 0;  // varlen: the sequence's first packed row
  if constexpr (kVarlen) {
    const fused::Sequence seq = fused::sequence_of(p.seq, p.mask, int(row / tq / p.H));
    if (int(row % tq) >= seq.mask.tq) return;
    q_row0 = seq.q_row0;
  }

  float m = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, p.lse_part[s * rows + row]);
  float acc[kPerLane] = {};
  float sum = 0.0f;
  if (m != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = expf(p.lse_part[s * rows + row] - m);  // lse_s -inf: 0
      sum += w;
      const float* o = p.o_part + (s * rows + row) * kD + lane * kPerLane;
#pragma unroll
      for (int j = 0; j < kPerLane; j += 2) {
        const float2 pair = *reinterpret_cast<const float2*>(o + j);
        acc[j] = fmaf(w, pair.x, acc[j]);
        acc[j + 1] = fmaf(w, pair.y, acc[j + 1]);
      }
    }
  }
  // sum >= 1 where m is finite (the maximal split weighs exactly 1).
  const float inv = m != -INFINITY ? 1.0f / sum : 0.0f;
  const int q = int(row % tq);
  const int64_t bh = row / tq;
  const int h = int(bh % p.H), b = int(bh / p.H);
  // Where the row goes in o and lse: varlen, packed row q_row0 + q of the
  // batch-of-one view.
  const int out_row = kVarlen ? q_row0 + q : q;
  const int out_b = kVarlen ? 0 : b;
  Elem* out = static_cast<Elem*>(p.o) + out_b * p.o_stride.batch + h * p.o_stride.head +
              int64_t(out_row) * p.o_stride.row + lane * kPerLane;
#pragma unroll
  for (int j = 0; j < kPerLane; j += 2)
    if (lane * kPerLane + j < p.head_dim)  // a padded head dim's columns end there
      *reinterpret_cast<uint32_t*>(out + j) = fused::pack2<Elem>(acc[j] * inv, acc[j + 1] * inv);
  if (lane == 0 && p.lse != nullptr)
    p.lse[out_b * p.lse_batch_stride + h * p.lse_head_stride + out_row] =
        m != -INFINITY ? m + logf(sum) : -INFINITY;
}

// Blocks of the combine kernel for problem p.
inline unsigned combine_blocks(const ForwardParams& p) {
  const int64_t rows = int64_t(p.B) * p.H * p.mask.tq;
  return unsigned((rows + kCombineWarps - 1) / kCombineWarps);
}

}  // namespace gqattn::hopper
