// cuda-flash: the fused-dQ paths' postprocess (DqStrategy::kOrdered and
// kAtomic). The dK/dV kernel leaves dQ / scale in the f32 accumulator
// [B*H, tq_padded, d] (fragment-major, dq_accum_layout.hpp); this kernel
// writes dq = accumulator * scale as 16-bit values. Ordered: only query tiles some key tile visited
// were written (their counter is then nonzero); the rows of the others (rows with no kept key) get
// 0. Atomic (no counters): the accumulator was zeroed, so every row is read. Checked through the
// ordered- and atomic-dQ tests in tests/gpu/test_flash_correctness.cpp.
//
// One thread per 8 elements of a row (four 8-byte loads, one 16-byte
// store), over (b, h, i < tq_padded); a varlen batch's sequence b has its
// rows from q_row0 and its accumulator rows and counters in its workspace
// block (fused::workspace_row; the block starts at a multiple of 128, so
// its counters are whole query tiles too). A padded head dim (kPadded:
// p.head_dim < kD): the threads of the chunks from head_dim on write
// nothing (the accumulator's columns there hold nothing of dq); a template
// flag, so that the other instances compile as without it.
#pragma once

#include <cstdint>

#include "cuda/flash/dq_accum_layout.hpp"
#include "cuda/flash/params.hpp"
#include "cuda/flash/tile_io.cuh"
#include "cuda/flash/tile_sizes.hpp"
#include "cuda/fused/fragment.cuh"
#include "cuda/fused/sequence.hpp"

namespace gqattn::flash {

// kRowsPerCounter: the kBlockM of the dK/dV tile that ran (one counter per
// query tile of it). kPadded: a head dim below kD (see above).
template <int kD, typename Elem, int kRowsPerCounter, bool kPadded = false>
__global__ void __launch_bounds__(kDqPostThreads)
    backward_dq_postprocess_kernel(const fused::BackwardParams p) {
  static_assert(kDqPostElemsPerThread == fused::kElemsPerChunk, "one 16-byte chunk per thread");
  constexpr int kChunks = kD / fused::kElemsPerChunk;  // per row
  constexpr int kBM = kRowsPerCounter;
  const int64_t gid = int64_t(blockIdx.x) * kDqPostThreads + threadIdx.x;
  const int64_t row = gid / kChunks;  // over [B*H, tq_padded]
  const int chunk = int(gid % kChunks);
  const int bh = int(row / p.tq_padded);
  const int i = int(row % p.tq_padded);
  if (bh >= p.B * p.H) return;
  if (kPadded && chunk * fused::kElemsPerChunk >= p.head_dim) return;
  const int b = bh / p.H;
  const int h = bh % p.H;
  const fused::Sequence seq = fused::sequence_of(p.seq, p.mask, b);
  if (i >= seq.mask.tq) return;
  // The accumulator row (`row` itself when dense).
  const int64_t ws_row = fused::workspace_row(p, b, h, seq.ws_row0) + i;
  const bool visited = p.dq_counters == nullptr || p.dq_counters[ws_row / kBM] != 0;

  float x[fused::kElemsPerChunk] = {};
  if (visited) {
    const float s = p.score.scale;
    // Columns 2k, 2k + 1 of the chunk are adjacent (one lane's pair).
#pragma unroll
    for (int k = 0; k < fused::kElemsPerChunk / 2; ++k) {
      const float2 u = *reinterpret_cast<const float2*>(
          p.dq_accum + dq_accum_offset(ws_row, chunk * fused::kElemsPerChunk + 2 * k, kD));
      x[2 * k] = u.x * s, x[2 * k + 1] = u.y * s;
    }
  }
  uint4 out;
  out.x = fused::pack2<Elem>(x[0], x[1]);
  out.y = fused::pack2<Elem>(x[2], x[3]);
  out.z = fused::pack2<Elem>(x[4], x[5]);
  out.w = fused::pack2<Elem>(x[6], x[7]);
  Elem* dq = static_cast<Elem*>(p.dq) + b * p.dq_stride.batch +
             (int64_t(seq.q_row0) + i) * p.dq_stride.row + h * p.dq_stride.head +
             chunk * fused::kElemsPerChunk;
  *reinterpret_cast<uint4*>(dq) = out;
}

}  // namespace gqattn::flash
