// cuda-flash: where element (row, col) of the fused-dQ f32 accumulator
// [B*H, tq_padded, d] lives (the dK/dV kernel adds into it, the postprocess
// reads it back), as plain integer functions (host and device), checked on
// the CPU by tests/cpu/test_flash_dq_accum_layout.cpp and through the
// ordered- and atomic-dQ GPU tests.
//
// Fragment-major layout: the rows are cut into blocks of 16 rows x 8
// columns (the C fragment of one m16n8 mma), blocks stored row-major over
// (row / 16, col / 8), and inside a block lane l's four values of the
// fragment (rows g, g + 8, columns 2t, 2t + 1; g = l / 4, t = l % 4) are
// the 16 bytes at 4 l (lane-major, on every architecture). A warp then adds
// one fragment with one 16-byte reduction per lane over 512 contiguous
// bytes (4 cache lines), where the row-major layout needs two 8-byte
// reductions per lane over 8 rows, i.e. 8 lines per instruction
// (FlashAttention-2 likewise keeps its dQ accumulator in the order its
// threads add, not row-major): docs/decisions/flash-dq-accum-fragment-major.md.
//
// Invariant: every index in [0, rows * d) is reached by exactly one (row,
// col) with row < rows, a multiple of 16 (tq_padded is a multiple of the
// dK/dV query tile), and d a multiple of 8.
#pragma once

#include <cstdint>

#include "cuda/fused/host_device.hpp"

namespace gqattn::flash {

constexpr int kDqBlockRows = 16;  // m16 of mma.m16n8k16
constexpr int kDqBlockCols = 8;   // n8
constexpr int kDqBlockFloats = kDqBlockRows * kDqBlockCols;
constexpr int kDqLaneFloats = 4;  // a C fragment's values per lane

// Index of the first float of the 16 x 8 block whose top-left element is
// (row0, col0), both multiples of the block's sides, in rows of d floats.
GQATTN_HD constexpr int64_t dq_accum_block_offset(int64_t row0, int col0, int d) {
  return row0 * d + int64_t(col0 / kDqBlockCols) * kDqBlockFloats;
}

// Index of value v (0..3) of lane `lane`'s C fragment inside a block:
// lane l's four values are the 16 bytes at 4 l.
GQATTN_HD constexpr int dq_accum_in_block(int lane, int v) { return lane * kDqLaneFloats + v; }

// Index of element (row, col): the definition the two functions above
// implement for C fragments.
GQATTN_HD constexpr int64_t dq_accum_offset(int64_t row, int col, int d) {
  const int r = int(row % kDqBlockRows), c = col % kDqBlockCols;
  const int lane = (r % 8) * 4 + c / 2;  // g = r mod 8, t = c / 2
  const int v = (r / 8) * 2 + c % 2;     // second row half: values 2, 3
  return dq_accum_block_offset(row - r, col - c, d) + dq_accum_in_block(lane, v);
}

}  // namespace gqattn::flash
