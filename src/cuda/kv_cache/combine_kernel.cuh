// The fused KV-cache path's last kernel, run when a plan splits the keys:
// per output row (sequence, head, query) the num_splits partials the
// attention kernel wrote (O normalised over each split's keys, f32, and
// its lse) become the row's o and lse:
//   m = max_s lse_s,  w_s = e^(lse_s - m),  lse = m + log(sum_s w_s),
//   o = sum_s w_s O_s / sum_s w_s,
// summed in split order, so the result is deterministic. A row no split
// kept a key of (m = -inf) gets o = 0, lse = -inf without computing a
// weight (e^(-inf - -inf) would be NaN). One warp per row. Checked by
// tests/gpu/test_kv_cache.cpp (long sequences split over many CTAs,
// determinism, batch invariance, rows without keys).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/kv_cache/params.hpp"

namespace gqattn::kv_cache {

constexpr int kCombineWarps = 4;  // rows per block
constexpr int kCombineThreads = kCombineWarps * fused::kWarpSize;

template <int kD, typename Elem>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const Params p) {
  constexpr int kPerLane = kD / fused::kWarpSize;
  static_assert(kPerLane % 2 == 0, "columns go out in pairs");
  const int64_t rows = int64_t(p.B) * p.H * p.Tq;
  const int64_t row = int64_t(blockIdx.x) * kCombineWarps + threadIdx.x / fused::kWarpSize;
  if (row >= rows) return;
  const int lane = int(threadIdx.x) % fused::kWarpSize;

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
  // sum >= 1 where m is finite (the largest split weighs exactly 1).
  const float inv = m != -INFINITY ? 1.0f / sum : 0.0f;
  const int i = int(row % p.Tq);
  const int h = int(row / p.Tq % p.H);
  const int b = int(row / p.Tq / p.H);
  Elem* out = static_cast<Elem*>(p.o) + b * p.o_stride.batch + int64_t(i) * p.o_stride.row +
              h * p.o_stride.head + lane * kPerLane;
#pragma unroll
  for (int j = 0; j < kPerLane; j += 2)
    if (lane * kPerLane + j < p.head_dim)  // a padded head dim's columns end there
      *reinterpret_cast<uint32_t*>(out + j) = fused::pack2<Elem>(acc[j] * inv, acc[j + 1] * inv);
  if (lane == 0 && p.lse != nullptr)
    p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] =
        m != -INFINITY ? m + logf(sum) : -INFINITY;
}

}  // namespace gqattn::kv_cache
